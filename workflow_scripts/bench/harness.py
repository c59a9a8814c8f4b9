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

Our runs go through workflow_scripts.job.launch, i.e. the pipeline's own trainer, sampler and metrics. Precision: the
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

from workflow_scripts import columns as C
from workflow_scripts import study
from workflow_scripts.bench import ceiling, trainer
from workflow_scripts.job.launch import environment
from workflow_scripts.job.lever_trial import measured, outcome, run_launcher, run_logged, write_spec
from workflow_scripts.measure.provenance import config_hash
from workflow_scripts.training import levers
from workflow_scripts.training.build_ops import needed_ops
from workflow_scripts.training.models import MODELS
from workflow_scripts.training.precision import policy
from workflow_scripts.training.strategies import get as get_strategy

EAGER = dict.fromkeys(levers.LEVERS, False)  # the lever ladder starts eager: each lever adds one
CEILING = "ceiling"  # the runner (and the strategy column) of the ceiling's rows


def matching_precision(strategy: str, precision: str) -> str:
    """The policy of ours that equals what Trainer(bf16=True) does for this strategy's family."""
    if not policy(precision).uses_bf16:
        return precision
    return "bf16-mixed" if get_strategy(strategy).family == "ddp" else "bf16-pure"


def spec_for(config: dict, strategy: str, overrides: dict, out: Path, run: str, repeat: int,
             world_size: int | None = None, options: dict | None = None) -> dict:
    """The run spec of one benchmark run: results under out/run, scratch under work_dir/bench/run; `options`: the
    run's strategy options where they are not the study's (a lever's, study.lever_run)."""
    b = config["bench"]
    if options is not None:  # resolved with them: the micro-batch split and the levers' evidence read the options
        config = {**config, "strategy_options": {**config["strategy_options"], strategy: options}}
    spec = study.run_spec(config, b["model"], strategy, world_size or b["world_size"], repeat,
                          {**b["train"], **overrides}, out_dir=str(out / run),
                          work_dir=str(Path(config["work_dir"]) / "bench" / run), ops=[])
    spec["ops"] = [f"{config['work_dir']}/ops/{op}.json" for op in needed_ops(strategy, spec["options"])]
    spec["study"] = f"{config['study']}/bench"
    spec["random_init"] = None  # each benchmark run builds its model in its own process (no random_init job)
    return spec


def ceiling_spec(config: dict, out: Path, r: int) -> dict:
    """The ceiling's run (bench.ceiling): one device, DDP's precision policy, the comparison's data and steps."""
    precision = matching_precision("ddp", config["train"]["precision"])
    spec = spec_for(config, "ddp", {"precision": precision}, out, f"ceiling/r{r}", r, world_size=1)
    return {**spec, "ceiling": config["bench"]["ceiling"]}


BASELINE_KEYS = ("trainer_setting", "ceiling")  # what a baseline's spec adds to the run spec it is built from


def run_part(spec: dict) -> dict:
    """The run spec inside a baseline's spec (without the keys only the Trainer or the ceiling read)."""
    return {k: v for k, v in spec.items() if k not in BASELINE_KEYS}


def run_module(module: str, spec: dict, summary: str, attempts: int = 1) -> dict:
    """A baseline (the Trainer under torchrun, or the ceiling in one process); a failed attempt is retried up to
    `attempts` times (it starts from scratch: no checkpoint), each attempt's output kept in <module>.attempt<N>.log,
    the number of attempts recorded."""
    path = write_spec(spec)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={spec['world_size']}",
           "-m", f"workflow_scripts.bench.{module}", "--spec", str(path)]
    for attempt in range(1, attempts + 1):
        code, tail = run_logged(cmd, path.parent / f"{module}.attempt{attempt}.log", env=environment(run_part(spec)))
        result = outcome(code, tail, Path(spec["out_dir"]) / summary, module)
        if result.get("status") in (C.OK, "unavailable"):
            break
        print(f"{module} attempt {attempt} failed: {result['reason']}", flush=True)
    return {**result, "attempts": attempt}


def lever_row(name: str, overrides: dict, s: dict, repeat: int) -> dict:
    return {"lever": name, "settings": json.dumps(overrides, sort_keys=True), "repeat": repeat, **measured(s),
            "step_time_s": s.get("step_time_median_s"), "micro_batch": s.get("micro_batch"),
            "vocab_size": s.get("vocab_size"), "precision": s.get("precision"), "reason": s.get("reason")}


class Rounds:
    """The rows of one part, written after every run (a job cut short keeps what it measured). Rows of an earlier
    attempt of the same job with the same config (read back from its rounds file, `config_sha`) are kept and their
    runs not repeated: a rerun after a time limit goes on where the last one stopped, never mixing two configs. The
    number of rounds is not part of the config's hash: a rerun asking for more rounds adds them to those it has."""

    def __init__(self, path: Path, config: dict, table):
        self.path, self.table = path, table
        self.sha = config_hash({**config, "bench": {k: v for k, v in config.get("bench", {}).items() if k != "rounds"}})
        old = pd.read_csv(path) if path.exists() else pd.DataFrame()
        self.rows = old[old["config_sha"] == self.sha].to_dict("records") if "config_sha" in old else []
        if self.rows:
            print(f"{len(self.rows)} runs kept from an earlier attempt of this job ({path})", flush=True)

    def done(self, **key) -> bool:
        return any(all(row.get(k) == v for k, v in key.items()) for row in self.rows)

    def add(self, row: dict) -> None:
        self.rows.append({**row, "config_sha": self.sha})
        self.write()

    def write(self) -> None:
        """The rounds file and the part's table (empty where nothing ran)."""
        df = self.frame()
        df.to_csv(self.path, index=False)
        write(self.table(df) if len(df) else df, self.path.with_name(self.path.name.replace("_rounds.csv", "")))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def run_levers(config: dict, out: Path, rounds: Rounds) -> None:
    b = config["bench"]
    for r in range(b["rounds"]):
        for lever in b["levers"]:
            if rounds.done(lever=lever["name"], repeat=r):
                continue
            strategy, run_options = study.lever_run(config, lever)
            eager = {k: v for k, v in EAGER.items() if k not in b["train"]}  # bench.train may set them
            spec = spec_for(config, strategy, {**eager, **lever["train"]}, out, f"levers/{lever['name']}/r{r}", r,
                            options=run_options)
            options = lever.get("options") or {}
            print(f"lever {lever['name']} (round {r})", flush=True)
            settings = {**lever["train"], **({"options": options} if options else {})}
            rounds.add({**lever_row(lever["name"], settings, run_launcher(spec), r), "strategy": strategy})


def comparison_row(strategy: str, r: int, precision: str, runner: str, s: dict) -> dict:
    return {"strategy": strategy, "repeat": r, "precision": precision, "runner": runner, **measured(s),
            "world_size": s.get("world_size"),
            "effective_batch": s.get("effective_batch"), "attempts": s.get("attempts"), "reason": s.get("reason")}


def run_comparison(config: dict, out: Path, rounds: Rounds) -> None:
    """Per round and strategy: ours, then the Trainer in every setting of bench.trainer_settings (eager,
    torch_compile, Liger), the order rotated every round so that no runner always goes first; then the ceiling
    (bench.ceiling). One row per run."""
    b = config["bench"]
    for r in range(b["rounds"]):
        for strategy in b["strategies"]:
            precision = matching_precision(strategy, config["train"]["precision"])
            ours = {**b["harness"], **b["harness_by_strategy"].get(strategy, {}), "precision": precision}
            runs = [("ours", spec_for(config, strategy, ours, out, f"ours/{strategy}/r{r}", r))]
            for setting in b["trainer_settings"]:
                spec = spec_for(config, strategy, {"precision": precision}, out,
                                f"trainer-{setting}/{strategy}/r{r}", r)
                runs.append((f"trainer:{setting}", {**spec, "trainer_setting": setting}))
            shift = r % len(runs)
            for runner, spec in runs[shift:] + runs[:shift]:  # interleaved
                if rounds.done(strategy=strategy, repeat=r, runner=runner):
                    continue
                print(f"{runner}: {strategy} (round {r})", flush=True)
                rounds.add(comparison_row(strategy, r, precision, runner, run_runner(runner, spec)))
        if b["ceiling"]["run"] and not rounds.done(runner=CEILING, repeat=r):  # after the round's strategies
            print(f"ceiling (round {r})", flush=True)
            spec = ceiling_spec(config, out, r)
            rounds.add(comparison_row(CEILING, r, spec["precision"], CEILING,
                                      run_module("ceiling", spec, ceiling.SUMMARY)))


def run_runner(runner: str, spec: dict) -> dict:
    """One run of the comparison: ours under the launcher, or the Trainer in its setting; a setting that cannot run
    here (Liger not installed, no Liger patch for the model) is its row without a launch. transformers' model_type
    is the registry family's name."""
    if runner == "ours":
        return run_launcher(spec)
    why_not = trainer.cannot_run(spec["trainer_setting"], MODELS[spec["model"]].family)
    if why_not:
        return {**trainer.unavailable(spec, spec["trainer_setting"], why_not), "attempts": 0}
    return run_module("trainer", spec, trainer.SUMMARY, 2)


def compare_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per strategy: ours and every Trainer setting as mean ± 95 % CI of tokens/s over the rounds, the Trainer's
    best setting (highest mean among the settings that ran), the ratio of ours to it and whether the two CIs
    overlap (None with fewer than two rounds), and ours per device over the ceiling (bench.ceiling). The ceiling
    has its own row (strategy `ceiling`, its MFU in the `ours MFU` column)."""
    from workflow_scripts.report.stats import ci_overlap, mean_ci

    ceiling_runs = df[(df["runner"] == CEILING) & (df["status"] == C.OK)]
    top = mean_ci(ceiling_runs["tokens_per_s"]) if len(ceiling_runs) else None
    out = []
    for strategy, part in df.groupby("strategy", sort=False):
        ok = part[part["status"] == C.OK]
        cis = {runner: mean_ci(g["tokens_per_s"]) for runner, g in ok.groupby("runner", sort=False)}
        row = {"strategy": strategy, "rounds": int(part["runner"].isin(["ours", CEILING]).sum()),
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
        if top and "ours" in cis:  # per device: the ceiling is one device with no communication
            world = int(part.loc[part["runner"] == "ours", "world_size"].iloc[0])
            row["ours / ceiling"] = cis["ours"].mean / (world * top.mean)
        mfu = ok.groupby("runner")["mfu"].mean()
        row["ours MFU"] = mfu.get("ours", mfu.get(CEILING))
        row["trainer best MFU"] = mfu.get(best) if best else None
        out.append(row)
    return pd.DataFrame(out)


def rounds_summary(df: pd.DataFrame, by: str) -> pd.DataFrame:
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
    name, part, table = {"levers": ("levers", run_levers, lambda df: rounds_summary(df, "lever")),
                         "compare": ("harness_vs_trainer", run_comparison, compare_summary)}[a.part]
    rounds = Rounds(out / f"{name}_rounds.csv", config, table)
    part(config, out, rounds)
    rounds.write()
    print((out / f"{name}.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
