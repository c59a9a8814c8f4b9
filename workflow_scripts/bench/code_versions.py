"""Is a row's difference between two result sets the code or the machine? One committed run, as each set's own
run_spec.json describes it, launched by this repository's launcher (`new`) and by an older tree of it (`old`) on one
machine, in interleaved rounds (bench.rounds.order), on one set of random tokens that both read.

    git archive <commit> workflow_scripts config.yaml schemas | tar -x -C <old tree>
    python -m workflow_scripts.bench.code_versions --old-tree DIR --old-spec A/run_spec.json \
        --new-spec B/run_spec.json [--strategies zero3,fsdp] [--rounds 3] [--steps 40] [--out DIR]

Each run keeps its spec but for the strategy, the data (random uint16 tokens of the spec's block size: a step's time
does not depend on the tokens), `--steps` and two evaluation batches. An older tree's launcher is
`workflow_scripts.launch`, a newer one's `workflow_scripts.job.launch`. Writes code_versions.csv (one row per run:
its median step, final loss) and code_versions.md (each version's step, mean and 95% CI over rounds, and old / new
paired within a round).
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workflow_scripts.bench import rounds

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("old", "new")
TRAIN_BLOCKS, VAL_BLOCKS = 2289, 61


def tokens(work: Path, block_size: int, vocab: int) -> dict:
    """Random token blocks and a manifest both launchers accept (the newer one checks the files' SHA-256)."""
    import numpy as np

    from workflow_scripts.data import checksum

    rng = np.random.default_rng(0)
    manifest = {"block_size": block_size, "vocab_size": vocab, "dtype": "uint16", "loss_on": "all"}
    paths = {}
    for name, blocks in (("train", TRAIN_BLOCKS), ("val", VAL_BLOCKS)):
        paths[name] = str(work / f"{name}.npy")
        np.save(paths[name], rng.integers(0, vocab, (blocks, block_size), dtype=np.uint16))
        manifest[f"{name}_blocks"], manifest[f"{name}_tokens"] = blocks, blocks * block_size
    manifest[checksum.KEY] = checksum.entries(paths)
    (work / "tokens_manifest.json").write_text(json.dumps(manifest))
    return {"manifest": str(work / "tokens_manifest.json"), **paths}


def launch(tree: Path, spec: dict) -> subprocess.CompletedProcess:
    module = "workflow_scripts.job.launch" if (tree / "workflow_scripts/job/launch.py").exists() \
        else "workflow_scripts.launch"
    return subprocess.run([sys.executable, "-m", module, "--spec-json", json.dumps(spec)], cwd=tree,
                          capture_output=True, text=True)


def one_run(variant: str, tree: Path, base: dict, strategy: str, round_: int, data: dict, steps: int,
            work: Path) -> dict:
    spec = copy.deepcopy(base)
    tag = f"{variant}_{strategy}_r{round_}"
    spec.update(strategy=strategy, repeat=round_, run_id=tag, data=data, out_dir=str(work / "runs" / tag),
                work_dir=str(work / "work" / tag), torch_extensions_dir=str(work / f"extensions_{variant}"))
    spec["train"].update(max_steps=steps, eval_batches=2)
    start = time.time()
    done = launch(tree, spec)
    summary_path = Path(spec["out_dir"]) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if done.returncode or summary.get("status") != "ok":
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
    return {"round": round_, "variant": variant, "strategy": strategy, "rc": done.returncode,
            "status": summary.get("status"), "step_s": summary.get("step_time_median_s"),
            "final_loss": summary.get("final_loss"), "wall_s": round(time.time() - start, 1)}


def main(argv=None):
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-tree", type=Path, required=True)
    ap.add_argument("--old-spec", type=Path, required=True)
    ap.add_argument("--new-spec", type=Path, required=True)
    ap.add_argument("--strategies", default="zero3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    specs = {"old": json.loads(a.old_spec.read_text()), "new": json.loads(a.new_spec.read_text())}
    trees = {"old": a.old_tree.resolve(), "new": REPO}
    work = Path(tempfile.mkdtemp(prefix="code_versions_"))
    manifest = json.loads(Path(REPO, specs["new"]["data"]["manifest"]).read_text()) \
        if Path(REPO, specs["new"]["data"]["manifest"]).exists() else {"block_size": 1024, "vocab_size": 50257}
    data = tokens(work, manifest["block_size"], manifest["vocab_size"])
    rows = []
    for r in range(a.rounds):
        for strategy in a.strategies.split(","):
            for variant in rounds.order(r, VARIANTS):
                rows.append(one_run(variant, trees[variant], specs[variant], strategy, r, data, a.steps, work))
                print(json.dumps(rows[-1]), flush=True)
    frame = pd.DataFrame(rows)
    tables = []
    for strategy, part in frame[frame.status == "ok"].groupby("strategy"):
        table = rounds.step_table(part, [("old", "new")])
        tables.append(f"**{strategy}**\n\n" + table.to_markdown(index=False, floatfmt=".4g"))
    rounds.write(frame, "\n\n".join(tables), a.out, "code_versions")


if __name__ == "__main__":
    main()
