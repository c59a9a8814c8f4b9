"""After a successful run, regenerate the HTML report (`snakemake --report`) with the run's effective config.

Called from the Snakefile's `onsuccess`; the effective config (config.yaml, --configfile and --config merged) is
written next to the report so the report's DAG is exactly the one that ran. The report opens on what the study
found: report/workflow.rst includes the findings (rule findings, workflow_scripts/report/findings.py), above the
repeats, micro-batch, step cap and seed (the landing page's metadata, report.metadata.yaml; with none, Snakemake
opens on the DAG), in report/report.css's wider page. A verify table newer than the findings (target verify ran
after them) brings the findings up to date first, so the first page gives its verdict.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

STYLESHEET = Path(__file__).resolve().parents[2] / "report/report.css"


def output_of(workflow, rule: str, name: str) -> Path | None:
    """A named output of a rule without wildcards (None when the workflow has no such rule)."""
    try:
        return Path(getattr(getattr(workflow.rules, rule).output, name))
    except (AttributeError, KeyError):
        return None


def findings_stale(workflow) -> Path | None:
    """The findings file when target verify's table is newer than it (or it is missing beside that table)."""
    findings, verified = output_of(workflow, "findings", "rst"), output_of(workflow, "compare_with_committed", "csv")
    if findings is None or verified is None or not verified.exists():
        return None
    return findings if not findings.exists() or verified.stat().st_mtime > findings.stat().st_mtime else None


def metadata(config: dict) -> dict:
    """The landing page's list under the findings: how much each number rests on. Numbers only: Snakemake's
    report shows a text value as its docutils parts, not as text."""
    train = config["train"]
    found = {"Repeats per configuration": config["repeats"], "Micro-batch size": train["micro_batch_size"],
             "Optimizer steps per run, at most": train["max_steps"], "Seed": train["seed"]}
    return {k: v for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def write_report_after_success(workflow, config: dict, report_path: str, needs: str | None = None) -> None:
    """`needs`: a file of the `all` target; without it (a run of `doctor` or `bench_harness` only) no report."""
    if os.environ.get("PIPELINE_NO_REPORT") or getattr(workflow, "dryrun", False):
        return
    if needs is not None and not Path(needs).exists():
        return
    effective = Path(report_path).with_name("config.effective.yaml")
    effective.parent.mkdir(parents=True, exist_ok=True)
    effective.write_text(yaml.safe_dump(config, sort_keys=True))
    meta = Path(report_path).with_name("report.metadata.yaml")
    meta.write_text(yaml.safe_dump(metadata(config), sort_keys=False))
    base = [sys.executable, "-m", "snakemake", "--snakefile", workflow.main_snakefile, "--configfile",
            str(effective), "--nolock", "--quiet"]
    env = {**os.environ, "PIPELINE_NO_REPORT": "1"}
    stale = findings_stale(workflow)
    if stale is not None:
        run(base + ["--cores", "1", str(stale)], env, "findings")
    run(base + ["--report", report_path, "--report-stylesheet", str(STYLESHEET), "--report-metadata", str(meta),
                "all"], env, "report", success=f"report: {report_path}")


def run(cmd: list[str], env: dict, what: str, success: str | None = None) -> None:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{what}: `{' '.join(cmd)}` failed:\n{done.stderr[-3000:]}", file=sys.stderr)
    elif success:
        print(success, file=sys.stderr)
