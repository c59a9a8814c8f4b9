"""What fits, before anything runs (rule `plan`, config `plan`):

    snakemake plan --cores 1 --configfile studies/<study>.yaml my_plan.yaml   (my_plan.yaml: plan: {gpus: [1, 2, 4]})
    python -m workflow_scripts.plan.planner --config-json '<the study config as JSON>' --out-dir <folder>

For every model x strategy x GPU count x micro-batch of the plan: the predicted peak per GPU (analytic memory
model, workflow_scripts/plan/memory_model.py: torch-allocated, and device-wide with the CUDA context, NCCL buffers
and allocator slack), the usable memory (gpu_memory_gib minus headroom_gib, a margin for the prediction's error),
the margin of the device-wide peak and whether it fits; then per model, strategy and GPU count the largest
micro-batch that fits. Writes plan.csv and plan.md (every cell a number or a symbol, each symbol's footnote below
its table). Needs no data, no GPU and no network: the embedding rows come from plan.vocab, else train.embedding_rows,
else the trained BPE's tokenizer.vocab_size, else, where the tokenizer is the model's own (its hub id), the
published model's vocabulary (PUBLISHED_VOCAB); any other hub tokenizer's size is only known after download: set
plan.vocab.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from workflow_scripts import study
from workflow_scripts.plan.predict import predict
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training import levers, recompute
from workflow_scripts.training.layout import MESH_ORDER
from workflow_scripts.training.models import MODELS, embedding_rows
from workflow_scripts.units import GIB


class PlanError(ValueError):
    pass


# The embedding rows of the published models whose tokenizer a study may name (their config.json's vocab_size):
# a study whose tokenizer is the model's own plans with these rows.
PUBLISHED_VOCAB = {"openai-community/gpt2": 50257, "openai-community/gpt2-medium": 50257,
                   "openai-community/gpt2-large": 50257, "openai-community/gpt2-xl": 50257,
                   "Qwen/Qwen2.5-Coder-1.5B": 151936, "Qwen/Qwen2.5-3B": 151936, "Qwen/Qwen1.5-MoE-A2.7B": 151936}


def model_vocab(config: dict, models: list) -> int | None:
    """The published vocabulary of the plan's models where the study's tokenizer is their own (a hub tokenizer
    named by every model's hub id), else None."""
    tokenizer = config["tokenizer"]
    if tokenizer.get("kind") != "hub" or not models:
        return None
    ids = {MODELS[m].hub_id for m in models if m in MODELS}
    if ids != {tokenizer.get("name")} or tokenizer.get("name") not in PUBLISHED_VOCAB:
        return None
    return PUBLISHED_VOCAB[tokenizer["name"]]


def plan_vocab(config: dict, models: list | None = None) -> int:
    plan, train = config["plan"], config["train"]
    if plan.get("vocab"):
        return embedding_rows(plan["vocab"], train)
    if config["tokenizer"]["kind"] == "bpe":
        return embedding_rows(config["tokenizer"]["vocab_size"], train)
    if train["embedding_rows"]:
        return embedding_rows(train["embedding_rows"], train)
    if published := model_vocab(config, models or []):
        return embedding_rows(published, train)
    raise PlanError("plan.vocab: the hub tokenizer's vocabulary is not known before it is downloaded and is not the "
                    "model's own; set it")


def usable_bytes(plan: dict) -> float:
    return (plan["gpu_memory_gib"] - plan["headroom_gib"]) * GIB


def planned_layout(spec: RunSpec) -> dict:
    """The candidate's layout as the models take it: data parallel and the dimensions it spans."""
    return {k: v for k, v in spec.layout.items() if v > 1 or k == "dp"}


def compiled(spec: RunSpec) -> bool:
    """Whether the candidate compiles (train.compile_blocks / compile_loss, `auto` resolved in its spec)."""
    return levers.compiles(spec.train, MODELS[spec.model].family, spec.layout)


def memory(spec: RunSpec, vocab: int, seq_len: int):
    """The analytic memory model's prediction of a candidate (plan/predict.py) from its spec."""
    return predict(model=spec.model, strategy=spec.strategy, precision=spec.precision,
                   world_size=spec.world_size, micro_batch=spec.micro_batch, seq_len=seq_len,
                   grad_accum=spec.accum, vocab=vocab, overrides=spec.model_overrides,
                   layout=planned_layout(spec), options=spec.options,
                   checkpointing=recompute.mode(spec.train), compiled=compiled(spec))


def step_rates(plan: dict):
    """The step-time model's rates from plan.calibration (a GPU kind, `h100`: its rate file, plan/rates/; or a
    calibration.json, its host costs its kind's: step_time.load_rates), or None."""
    if not plan.get("calibration"):
        return None
    from workflow_scripts.plan.step_time import load_rates, rates_file

    try:
        return load_rates(rates_file(plan["calibration"]))
    except ValueError as exc:
        raise PlanError(f"plan.calibration: {exc}") from None


def throughput(spec: RunSpec, rates, vocab: int, seq_len: int, fabric=None) -> dict:
    """A candidate's predicted step (plan/step_time.py; on a simulated network: plan/fabric.py): tokens/s per GPU,
    MFU and what bounds it, or (step_note) why the model has none: a run it does not cover (step_time.not_modelled)
    or a term whose input the rates lack (`<rates file> has no all_reduce bus-bandwidth curve`)."""
    if rates is None:
        return {}
    from workflow_scripts.measure.metrics import mfu
    from workflow_scripts.plan import step_time
    from workflow_scripts.training.models import model_flops_per_token

    layout = planned_layout(spec)
    micro, accum = spec.micro_batch, spec.accum
    run = step_time.run_for(model=spec.model, strategy=spec.strategy, precision=spec.precision, layout=layout,
                            micro_batch=micro, accum=accum, seq_len=seq_len, vocab=vocab, train=spec.train,
                            options=spec.options, overrides=spec.model_overrides)
    if why := step_time.not_modelled(run):
        return {"step_note": why, "levers": run.levers}
    p = step_time.predict(run, rates, fabric)
    if not p.modelled:
        return {"step_note": p.why, "levers": run.levers, "step_notes": "; ".join(p.notes)}
    world = math.prod(layout.get(k, 1) for k in MESH_ORDER)
    per_gpu = micro * accum * seq_len * layout.get("dp", 1) / world / p.step_s  # the dp replicas' samples
    flops = model_flops_per_token(spec.model, run.shape.n_params, seq_len, run.trainable)
    return {"predicted_step_s": p.step_s, "predicted_tokens_per_s_per_gpu": per_gpu,
            "predicted_mfu": mfu(flops, per_gpu, 1, rates.device), "bound": p.bound, "levers": run.levers,
            "comm_share": p.parts["comm"] / p.step_s, "step_notes": "; ".join(p.notes)}


def rows(config: dict) -> pd.DataFrame:
    plan, train = config["plan"], config["train"]
    models = plan.get("models") or study.all_names(config, "models")
    vocab = plan_vocab(config, models)
    seq_len = plan.get("seq_len") or config["data"]["block_size"]
    strategies = plan.get("strategies") or study.all_names(config, "strategies")
    gpus = plan.get("gpus") or study.all_names(config, "world_sizes")
    precision = plan.get("precision") or train["precision"]
    usable = usable_bytes(plan)
    rates = step_rates(plan)
    out = []
    for model in models:
        for strategy in strategies:
            for n in gpus:
                for mb in plan["micro_batches"]:
                    spec = study.candidate(config, model, strategy, n, mb, seq_len, precision)
                    p = memory(spec, vocab, seq_len)
                    total, device = (p.total, p.device) if p.modelled else (None, None)
                    cell = {"model": model, "strategy": strategy, "gpus": n, "micro_batch": mb,
                            "precision": precision}
                    out.append({**cell,
                                "predicted_gib": None if total is None else total / GIB,
                                "predicted_device_gib": None if device is None else device / GIB,
                                "usable_gib": usable / GIB,
                                "margin_gib": None if device is None else (usable - device) / GIB,
                                # an upper bound (compiled) that exceeds the usable memory says nothing
                                "fits": None if device is None or (p.bound and device > usable)
                                else bool(device <= usable),
                                "method": p.method if p.modelled else "", "bound": p.bound, "note": p.why,
                                **{f"time_{k}" if k == "bound" else k: v
                                   for k, v in throughput(spec, rates, vocab, seq_len).items()}})
    return pd.DataFrame(out)


STEP_COLUMNS = ("predicted_tokens_per_s_per_gpu", "predicted_mfu", "time_bound", "levers", "step_note")


def ranking(frame: pd.DataFrame, top: int = 10) -> list[str]:
    """Per model, the candidates that fit, fastest first by predicted tokens/s per GPU, with what bounds each; then
    those that fit and have no predicted step, a row per strategy, GPU count and reason (their micro-batches), `–`
    where a number would be (–1, –2, ... where the model has several reasons), each reason footnoted below."""
    if not any(c in frame for c in ("predicted_tokens_per_s_per_gpu", "step_note")):
        return ["No throughput ranking: set plan.calibration to a GPU kind (h100, h200: workflow_scripts/plan/rates/) "
                "or a calibration.json measured by `calibrate`.", ""]
    frame = frame.assign(**{c: None for c in STEP_COLUMNS if c not in frame})
    lines = ["Ranked by predicted throughput (step-time model, plan/step_time.py; candidates that fit):", ""]
    host_bound = False
    for model, part in frame[frame["fits"] == True].groupby("model", sort=False):  # noqa: E712
        predicted = part["predicted_tokens_per_s_per_gpu"].notna()
        best = part[predicted].sort_values("predicted_tokens_per_s_per_gpu", ascending=False).head(top)
        unranked = part[~predicted]
        unranked = unranked.assign(step_note=unranked["step_note"].fillna(""))
        reasons = list(dict.fromkeys(unranked["step_note"]))
        marks = {why: NONE if len(reasons) == 1 else f"{NONE}{i}" for i, why in enumerate(reasons, 1)}
        lines += [f"#### {model}", "", "| rank | strategy | GPUs | mb | levers | tokens/s per GPU | MFU | bound |",
                  "|---|---|---|---|---|---|---|---|"]
        for i, (_, r) in enumerate(best.iterrows(), 1):
            mfu = "–" if pd.isna(r["predicted_mfu"]) else f"{r['predicted_mfu']:.1%}"
            lines.append(f"| {i} | `{r['strategy']}` | {r['gpus']} | {r['micro_batch']} | {r['levers']} | "
                         f"{r['predicted_tokens_per_s_per_gpu']:,.0f} | {mfu} | {r['time_bound']} |")
        for (strategy, n, why), cells in unranked.groupby(["strategy", "gpus", "step_note"], sort=False):
            mbs = ", ".join(str(m) for m in cells["micro_batch"])
            levers = "/".join(dict.fromkeys(str(v) for v in cells["levers"].dropna())) or NONE
            lines.append(f"| {NONE} | `{strategy}` | {n} | {mbs} | {levers} | {marks[why]} | {NONE} | {NONE} |")
        lines.append("")
        if reasons:
            lines += [f"{marks[why]} not modelled: {why or 'no reason given'}" for why in reasons] + [""]
        host_bound |= bool((best["time_bound"] == "host").any())
    return lines + ([HOST_BOUND_NOTE, ""] if host_bound else [])


# what a host-bound prediction cannot see (the step-time model's error by bound: experiments/step_time)
HOST_BOUND_NOTE = ("Bound `host`: the step waits on the host's launches and hooks, whose pace a rented machine's "
                   "CPUs do not hold (one CPU moved 2x from one second to the next): the model misses such rows "
                   "about twice as far as device-bound ones (held out, by bound), so host-bound candidates close in "
                   "tokens/s are a tie until measured.")


def largest_fitting(frame: pd.DataFrame) -> pd.DataFrame:
    fit = frame[frame["fits"] == True]  # noqa: E712 - None (not modelled) is neither
    best = fit.groupby(["model", "strategy", "gpus"])["micro_batch"].max().rename("largest_micro_batch")
    return frame[["model", "strategy", "gpus"]].drop_duplicates().merge(
        best.reset_index(), how="left", on=["model", "strategy", "gpus"])


FITS, FITS_NOT, UNKNOWN, UPPER, NONE, AT_LEAST = "✓", "✗", "?", "≤", "–", "≥"  # the table's symbols
UPPER_NOTE = ("compiled: the eager count, an upper bound of the torch-allocated peak (inductor saves less; the "
              "device-wide figure can pass it by a few % of allocator slack); ? where the bound does not fit: the "
              "compiled run may.")


def cell(r, none_mark: str) -> str:
    """One candidate's cell: its device-wide peak in GiB with ✓ / ✗ / ? and ≤ for a bound, or `none_mark`."""
    if pd.isna(r["predicted_device_gib"]):
        return none_mark
    mark = UNKNOWN if r["fits"] is None else FITS if r["fits"] else FITS_NOT
    return f"{UPPER + ' ' if r['bound'] else ''}{r['predicted_device_gib']:.1f} {mark}"


def markdown(frame: pd.DataFrame, plan: dict) -> str:
    """Per model a table of numbers (GiB) and symbols, each symbol it uses footnoted once below it; a cell the model
    does not predict is `–` (numbered –1, –2, ... where the table has several reasons)."""
    lines = [f"Plan: {plan['gpu_memory_gib']} GiB per GPU, {plan['headroom_gib']} GiB kept free (the prediction's "
             "error). Each cell: the predicted device-wide peak per GPU in GiB (analytic memory model: "
             f"torch-allocated peak, allocator slack, CUDA context, NCCL buffers); {FITS} fits, {FITS_NOT} does not.",
             ""]
    mbs = list(plan["micro_batches"])
    best = largest_fitting(frame).set_index(["model", "strategy", "gpus"])["largest_micro_batch"]
    for model, part in frame.groupby("model", sort=False):
        reasons = list(dict.fromkeys(part.loc[part["predicted_device_gib"].isna(), "note"].fillna("")))
        marks = {why: NONE if len(reasons) == 1 else f"{NONE}{i}" for i, why in enumerate(reasons, 1)}
        at_least = False
        lines += [f"### {model}", "", "| strategy | GPUs | " + " | ".join(f"mb {m}" for m in mbs)
                  + " | largest mb that fits |", "|---|---|" + "---|" * (len(mbs) + 1)]
        for (strategy, n), cells in part.groupby(["strategy", "gpus"], sort=False):
            by_mb = cells.set_index("micro_batch")
            text = [cell(by_mb.loc[m], marks.get(by_mb.loc[m, "note"] or "", NONE)) for m in mbs]
            largest = best.loc[(model, strategy, n)]
            above = cells[cells["micro_batch"] > (0 if pd.isna(largest) else largest)]
            open_above = above["fits"].isna().any()  # a larger micro-batch is unknown or not predicted
            at_least |= bool(open_above)
            lines.append(f"| `{strategy}` | {n} | " + " | ".join(text) + " | "
                         + (NONE if pd.isna(largest) and open_above else FITS_NOT if pd.isna(largest)
                            else f"{AT_LEAST + ' ' if open_above else ''}{int(largest)}") + " |")
        lines.append("")
        if part["bound"].astype(bool).any():
            lines.append(f"{UPPER} {UPPER_NOTE}")
        if at_least:
            lines.append(f"{AT_LEAST} the largest micro-batch predicted to fit; a larger one is {UNKNOWN} or {NONE}.")
        lines += [f"{marks[why]} not predicted: {why or 'no reason given'}" for why in reasons]
        lines.append("")
    return "\n".join(lines + ranking(frame))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    config = json.loads(args.config_json)
    try:
        frame = rows(config)
    except PlanError as exc:
        raise SystemExit(f"invalid plan: {exc}") from None
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "plan.csv", index=False)
    text = markdown(frame, config["plan"])
    (out / "plan.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
