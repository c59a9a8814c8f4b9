"""What the benchmarks of one process per variant share (step_overheads/, tensor_parallel/, fsdp_layers/): the
variants' order within a round, a child process's answer, a table of steps and their paired ratios, and the rounds
written beside their summary."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def add_ranks(ap) -> None:
    """The `--ranks` option of the benchmarks that run each rank count as its own torchrun (tp_host, tp_block,
    fsdp_layers)."""
    ap.add_argument("--ranks", default="1,2", help="a comma list of rank counts, each a torchrun on one node")


def order(round_: int, variants: tuple) -> tuple:
    """The variants of one round: as given in even rounds, reversed in odd ones (no variant always runs first)."""
    return variants if round_ % 2 == 0 else variants[::-1]


def answer(stdout: str) -> dict:
    """A child's answer: the JSON on the last line of its output (libraries may print before it)."""
    return json.loads(stdout.strip().splitlines()[-1])


def child(module: str, args: list[str], env: dict | None = None) -> dict:
    """Run `python -m module args` to its end; its answer."""
    done = subprocess.run([sys.executable, "-m", module, *args], env=env, check=True, capture_output=True, text=True)
    return answer(done.stdout)


def paired(rows, value: str, over: str, under: str):
    """mean_ci of `value`'s ratio variant `over` / variant `under` within each round (rows: one per round and
    variant)."""
    from workflow_scripts.report.stats import mean_ci

    by = rows.pivot(index="round", columns="variant", values=value)
    return mean_ci(by[over] / by[under])


def step_table(rows, ratios):
    """Each variant's step (ms, mean and 95% CI over its rounds), then each (over, under) ratio of `ratios` paired
    within a round, where both variants ran (rows: one per round and variant, column step_s)."""
    import pandas as pd

    from workflow_scripts.report.stats import mean_ci

    out = []
    for variant, df in rows.groupby("variant", sort=False):
        step = mean_ci(df.step_s)
        out.append({"variant": variant, "rounds": step.n, "step (ms)": 1e3 * step.mean,
                    "± 95% CI": 1e3 * step.half_width})
    for over, under in ratios:
        if {over, under} <= set(rows.variant):
            ratio = paired(rows, "step_s", over, under)
            out.append({"variant": f"{over} / {under} (ratio, same round)", "rounds": ratio.n,
                        "step (ms)": ratio.mean, "± 95% CI": ratio.half_width})
    return pd.DataFrame(out)


def write(rows, table: str, out: Path | None, name: str) -> None:
    """Print the rounds (a DataFrame) and their summary (Markdown); with `out`, <name>.csv and <name>.md there."""
    print(rows.to_string(index=False), table, sep="\n\n")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        rows.to_csv(out / f"{name}.csv", index=False)
        (out / f"{name}.md").write_text(table + "\n")
