"""Rule random_init's job: build one random initialisation (workflow_scripts/training/random_init.py) into its
folder, its output in the job's log and, on failure, the error's one line and the log's path where Snakemake shows
them (job/job_log.py), as a training job's.
  python3 -m workflow_scripts.job.random_init --recipe-json '{...}' --out DIR --log LOG
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from workflow_scripts.job import job_log
from workflow_scripts.training import random_init


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe-json", required=True, help="the recipe (workflow_scripts.study.random_init_recipe)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--log", help="the job's log: all output goes there, a failure is two lines on stderr")
    args = ap.parse_args(argv)
    shown = job_log.redirect(args.log)
    try:
        info = random_init.build(json.loads(args.recipe_json), args.out)
    except Exception as exc:  # noqa: BLE001 - the traceback into the log, its one line where the person looks
        traceback.print_exc()
        job_log.failed(shown, "random_init", 1, job_log.summary(exc), args.log)
        return 1
    print(f"{info['recipe']['model']} seed {info['recipe']['seed']}: {info['parameters']:,} parameters built in "
          f"{info['build_s']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
