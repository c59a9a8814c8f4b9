"""Benchmark of the training harness itself (`snakemake --cores all bench_harness --configfile
studies/bench_harness.yaml`; rules bench_levers and bench_compare are its two parts):

1. the lever ladder: one strategy (`bench.lever_strategy`, DDP by default) under each named set of harness
   settings in `bench.levers` (micro-batch, vocabulary padding, compiled blocks, compiled loss, ...), so each lever's
   gain is measured on its own;
2. ours vs Hugging Face `Trainer` at its best: for every strategy in `bench.strategies`, our trainer with
   `bench.harness` and the Trainer (workflow_scripts.bench.trainer) in every setting of `bench.trainer_settings`
   (eager, `torch_compile=True`, Liger kernels) with the same model, data, strategy settings, precision and
   effective batch, interleaved (the order rotates every round) in the same job; the table compares ours with the
   fastest Trainer setting, mean ± 95 % CI over `bench.rounds`.

Our runs go through workflow_scripts.training.launch, i.e. the pipeline's own trainer, sampler and metrics. Precision: the
Trainer's `bf16=True` means autocast for DDP, DeepSpeed's bf16 mode and FSDP2's bf16 MixedPrecisionPolicy, so
under a bf16 study policy our runs take the matching policy per family: bf16-mixed for DDP, bf16-pure for
DeepSpeed and FSDP (recorded per row).

Writes into --out-dir: levers.csv / .md, harness_vs_trainer.csv / .md, and per run its summary files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from workflow_scripts import study
from workflow_scripts.training import harness
from workflow_scripts.training.build_ops import needed_ops
from workflow_scripts.training.lever_trial import measured, outcome, run_launcher, run_logged, write_spec
from workflow_scripts.training.precision import policy
from workflow_scripts.training.launch import environment
from workflow_scripts.training.strategies import get as get_strategy

EAGER = dict.fromkeys(harness.LEVERS, False)  # the lever ladder starts eager: each lever adds one


def matching_precision(strategy: str, precision: str) -> str:
    """The policy of ours that equals what Trainer(bf16=True) does for this strategy's family."""
    if not policy(precision).uses_bf16:
        return precision
    return "bf16-mixed" if get_strategy(strategy).family == "ddp" else "bf16-pure"


def spec_for(config: dict, strategy: str, overrides: dict, out: Path, run: str, repeat: int) -> dict:
    """The run spec of one benchmark run: results under out/run, scratch under work_dir/bench/run."""
    b = config["bench"]
    ops = [f"{config['work_dir']}/ops/{op}.json" for op in needed_ops(strategy, config["platform"])]
    spec = study.run_spec(config, b["model"], strategy, b["world_size"], repeat, {**b["train"], **overrides},
                          out_dir=str(out / run), work_dir=str(Path(config["work_dir"]) / "bench" / run), ops=ops)
    spec["study"] = f"{config['study']}/bench"
    return spec


def run_trainer(spec: dict, attempts: int = 2) -> dict:
    """The Trainer baseline; a failed attempt is retried once (it starts from scratch: no checkpoint) and the
    attempts are recorded, the failed one's output kept in trainer.attempt<N>.log."""
    path = write_spec(spec)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec['world_size']}",
           "-m", "workflow_scripts.bench.trainer", "--spec", str(path)]
    for attempt in range(1, attempts + 1):
        code, tail = run_logged(cmd, path.parent / f"trainer.attempt{attempt}.log", env=environment(spec))
        result = outcome(code, tail, Path(spec["out_dir"]) / "trainer_summary.json", "trainer")
        if result.get("status") in ("ok", "unavailable"):
            break
        print(f"trainer attempt {attempt} failed: {result['reason']}", flush=True)
    return {**result, "attempts": attempt}


def lever_row(name: str, overrides: dict, s: dict, repeat: int) -> dict:
    return {"lever": name, "settings": json.dumps(overrides, sort_keys=True), "repeat": repeat, **measured(s),
            "step_time_s": s.get("step_time_median_s"), "micro_batch": s.get("micro_batch"),
            "vocab_size": s.get("vocab_size"), "precision": s.get("precision"), "reason": s.get("reason")}


def run_levers(config: dict, out: Path, save=lambda rows: None) -> pd.DataFrame:
    b, rows = config["bench"], []
    for r in range(b["rounds"]):
        for lever in b["levers"]:
            strategy = lever.get("strategy", b["lever_strategy"])
            eager = {k: v for k, v in EAGER.items() if k not in b["train"]}  # bench.train may set them
            spec = spec_for(config, strategy, {**eager, **lever["train"]}, out, f"levers/{lever['name']}/r{r}", r)
            print(f"lever {lever['name']} (round {r})", flush=True)
            rows.append({**lever_row(lever["name"], lever["train"], run_launcher(spec), r), "strategy": strategy})
            save(pd.DataFrame(rows))
    return pd.DataFrame(rows)


def comparison_row(strategy: str, r: int, precision: str, runner: str, s: dict) -> dict:
    return {"strategy": strategy, "repeat": r, "precision": precision, "runner": runner, **measured(s),
            "effective_batch": s.get("effective_batch"), "attempts": s.get("attempts"), "reason": s.get("reason")}


def run_comparison(config: dict, out: Path, save=lambda df: None) -> pd.DataFrame:
    """Per round and strategy: ours, then the Trainer in every setting of bench.trainer_settings (eager,
    torch_compile, Liger), the order rotated every round so that no runner always goes first. One row per run."""
    b, rows = config["bench"], []
    for r in range(b["rounds"]):
        for strategy in b["strategies"]:
            precision = matching_precision(strategy, config["train"]["precision"])
            runs = [("ours", spec_for(config, strategy, {**b["harness"], "precision": precision}, out,
                                      f"ours/{strategy}/r{r}", r))]
            for setting in b["trainer_settings"]:
                spec = spec_for(config, strategy, {"precision": precision}, out,
                                f"trainer-{setting}/{strategy}/r{r}", r)
                runs.append((f"trainer:{setting}", {**spec, "trainer_setting": setting}))
            shift = r % len(runs)
            for runner, spec in runs[shift:] + runs[:shift]:  # interleaved
                print(f"{runner}: {strategy} (round {r})", flush=True)
                result = run_launcher(spec) if runner == "ours" else run_trainer(spec)
                rows.append(comparison_row(strategy, r, precision, runner, result))
                save(pd.DataFrame(rows))
    return pd.DataFrame(rows)


def compare_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per strategy: ours and every Trainer setting as mean ± 95 % CI of tokens/s over the rounds, the Trainer's
    best setting (highest mean among the settings that ran), the ratio of ours to it and whether the two CIs
    overlap (None with fewer than two rounds)."""
    from workflow_scripts.report.stats import ci_overlap, mean_ci

    out = []
    for strategy, part in df.groupby("strategy", sort=False):
        ok = part[part["status"] == "ok"]
        cis = {runner: mean_ci(g["tokens_per_s"]) for runner, g in ok.groupby("runner", sort=False)}
        row = {"strategy": strategy, "rounds": int((part["runner"] == "ours").sum()),
               "precision": part["precision"].iloc[0]}
        for runner in part["runner"].unique():
            ci = cis.get(runner)
            row[f"{runner} n"] = 0 if ci is None else ci.n
            row[f"{runner} tokens/s"] = None if ci is None else ci.mean
            row[f"{runner} ±95%"] = None if ci is None else ci.half_width
            if ci is None:
                row[f"{runner} reason"] = str(part.loc[part["runner"] == runner, "reason"].iloc[0])
        trainers = {k: v for k, v in cis.items() if k.startswith("trainer:")}
        best = max(trainers, key=lambda k: trainers[k].mean) if trainers else None
        row["trainer best"] = best
        if best and "ours" in cis:
            row["ratio to best"] = cis["ours"].mean / trainers[best].mean
            row["CIs overlap"] = ci_overlap(cis["ours"], trainers[best])
        mfu = ok.groupby("runner")["mfu"].mean()
        row["ours MFU"] = mfu.get("ours")
        row["trainer best MFU"] = mfu.get(best) if best else None
        out.append(row)
    return pd.DataFrame(out)


def summarise(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Mean over rounds per strategy / lever (numeric columns), first value of the others."""
    if df.empty:
        return df
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    agg = {c: ("mean" if c in numeric else "first") for c in df.columns if c not in (by, "repeat")}
    out = df.groupby(by, sort=False).agg(agg).reset_index()
    out.insert(1, "rounds", df.groupby(by, sort=False).size().values)
    return out


def merge_rounds(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Rounds files of several commands as one: each file's rounds renumbered after the previous file's, and the
    file's position recorded (column `command`)."""
    out, offset = [], 0
    for i, df in enumerate(frames):
        df = df.assign(command=i, repeat=df["repeat"] + offset)
        offset = int(df["repeat"].max()) + 1
        out.append(df)
    return pd.concat(out, ignore_index=True)


def write(df: pd.DataFrame, path: Path) -> None:
    df.to_csv(path.with_suffix(".csv"), index=False)
    path.with_suffix(".md").write_text(df.to_markdown(index=False, floatfmt=".4g") + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config-json", help="the study config (with its bench section) as JSON")
    ap.add_argument("--part", choices=["levers", "compare"], required=True,
                    help="levers: the lever ladder; compare: ours vs the Trainer")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--merge", nargs="+", metavar="ROUNDS_CSV",
                    help="compare only: no runs; the table of these rounds files together (commands that each ran "
                         "some rounds of the same settings on the same machine), their rounds numbered in order")
    a = ap.parse_args(argv)
    if a.merge:
        merged = merge_rounds([pd.read_csv(p) for p in a.merge])
        merged.to_csv(Path(a.out_dir) / "harness_vs_trainer_rounds.csv", index=False)
        write(compare_summary(merged), Path(a.out_dir) / "harness_vs_trainer")
        print((Path(a.out_dir) / "harness_vs_trainer.md").read_text(), flush=True)
        return
    if not a.config_json:
        ap.error("--config-json is needed unless --merge is given")
    config = json.loads(a.config_json)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name, part, table = {"levers": ("levers", run_levers, lambda df: summarise(df, "lever")),
                         "compare": ("harness_vs_trainer", run_comparison, compare_summary)}[a.part]

    def save(df: pd.DataFrame) -> None:  # after every row: a job cut short keeps what it measured
        df.to_csv(out / f"{name}_rounds.csv", index=False)
        write(table(df), out / name)

    save(part(config, out, save))
    print((out / f"{name}.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
