"""After a successful run, regenerate the HTML report (`snakemake --report`) with the run's effective config.

Called from the Snakefile's `onsuccess`; the effective config (config.yaml, --configfile and --config merged) is
written next to the report so the report's DAG is exactly the one that ran.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml


def write_report_after_success(workflow, config: dict, report_path: str, needs: str | None = None) -> None:
    """`needs`: a file of the `all` target; without it (a run of `doctor` or `bench_harness` only) no report."""
    if os.environ.get("PIPELINE_NO_REPORT") or getattr(workflow, "dryrun", False):
        return
    if needs is not None and not Path(needs).exists():
        return
    effective = Path(report_path).with_name("config.effective.yaml")
    effective.parent.mkdir(parents=True, exist_ok=True)
    effective.write_text(yaml.safe_dump(config, sort_keys=True))
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", workflow.main_snakefile, "--configfile",
           str(effective), "--report", report_path, "--nolock", "--quiet", "all"]
    env = {**os.environ, "PIPELINE_NO_REPORT": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"report: `{' '.join(cmd)}` failed:\n{done.stderr[-3000:]}", file=sys.stderr)
    else:
        print(f"report: {report_path}", file=sys.stderr)
