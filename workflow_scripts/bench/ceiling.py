"""The ceiling beside the peer: the fastest plain loop we know how to write for the benchmark's model on one device,
so that ours and the Trainer are read against what the hardware allows, not only against each other.

    python -m workflow_scripts.bench.ceiling --spec run_spec.json

One process, one device, no strategy and no communication: the same model (registry entry, embedding rows, SDPA),
the same token blocks in the same order (training.batches), micro-batch and accumulation, the same next-token loss
in fp32, AdamW with the same hyper-parameters (fused on CUDA) at a constant learning rate, gradient clipping as the
spec says. Precision: autocast to bf16 over fp32 parameters under a bf16 policy (what DDP does), fp32 otherwise.
The loss function (forward; AOTAutograd compiles its backward with it) is compiled whole with
`torch.compile(mode="reduce-overhead")` on CUDA, so forward and backward replay as CUDA graphs, a new capture
only when a shape changes; `compile: false` in the spec's `ceiling` settings leaves it eager (CPU tests: compiling
on two cores costs minutes), `cuda_graphs: false` compiles without graphs.

Throughput: wall time between the end of optimizer step `timing_warmup_steps` and the end of the last step, one
device synchronisation at each end (as bench.trainer). For a benchmark of N devices the table multiplies it by N:
N independent devices with no communication, an upper bound no strategy reaches. Writes ceiling_summary.json into
the spec's out_dir.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from workflow_scripts import columns as C
from workflow_scripts.measure import metrics as M
from workflow_scripts.run_spec import RunSpec
from workflow_scripts.training.batches import Batches, load_data, make_model
from workflow_scripts.training.context import from_spec
from workflow_scripts.training.models import count_params, model_flops_per_token
from workflow_scripts.training.precision import policy
from workflow_scripts.training.strategies.engine import input_ids, lm_loss

SUMMARY = "ceiling_summary.json"


def settings(spec: dict, cuda: bool) -> dict:
    """What the loop does (the spec's `ceiling`: config bench.ceiling, its defaults filled in): compiled, and
    replayed as CUDA graphs where the device has them."""
    given = spec["ceiling"]
    compiled = bool(given["compile"])
    return {"compile": compiled, "cuda_graphs": compiled and cuda and bool(given["cuda_graphs"]),
            "fused_adamw": cuda, "autocast_bf16": policy(spec["precision"]).uses_bf16}


def loss_function(model, s: dict, device: torch.device):
    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s["autocast_bf16"]):
            logits = model(input_ids=input_ids(tokens)).logits
        return lm_loss(logits, tokens)

    if not s["compile"]:
        return loss_of
    return torch.compile(loss_of, mode="reduce-overhead" if s["cuda_graphs"] else None)


def run(spec: dict) -> dict:
    t = spec["train"]
    cuda = spec["platform"] != "cpu"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, int(t.get("threads_per_rank", 1))))
    ctx = from_spec({**spec, "world_size": 1, "layout": {"dp": 1}}, 0, 0, 1, device)  # one device, pure data
    data, blocks, _, vocab = load_data(spec)
    seq_len = data["block_size"]
    torch.manual_seed(t["seed"])
    model = make_model(RunSpec.of(spec), vocab, seq_len).to(device)
    n_params = count_params(model)
    s = settings(spec, cuda)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t["lr"], betas=tuple(t["betas"]), eps=t["eps"],
                            weight_decay=t["weight_decay"], fused=cuda or None)
    loss_of = loss_function(model, s, device)
    batches = Batches(blocks, ctx, t["seed"], pin=cuda)
    steps = min(t["epochs"] * batches.steps_per_epoch, t.get("max_steps") or 10**12)
    warmup = t["timing_warmup_steps"]
    if steps <= warmup:
        raise ValueError(f"bench ceiling: {steps} steps leave none after {warmup} timing warm-up steps")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    logged, start = [], synchronised_now(cuda) if warmup == 0 else None
    for step in range(steps):
        for tokens in batches.micro_batches(step):
            if s["cuda_graphs"]:
                torch.compiler.cudagraph_mark_step_begin()
            loss = loss_of(tokens)
            (loss / ctx.accum).backward()
        if t["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(params, t["grad_clip"], foreach=cuda or None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % t["log_every"] == 0 or step == steps - 1:
            logged.append(loss.detach().clone())  # a graph's output is overwritten by its next replay
        if step == warmup - 1:
            start = synchronised_now(cuda)
    seconds = synchronised_now(cuda) - start
    tokens_per_s = (steps - warmup) * ctx.effective_batch * seq_len / seconds
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    fpt = model_flops_per_token(spec["model"], n_params, seq_len)
    losses = [float(x) for x in logged]
    return {"status": C.OK, "runner": "ceiling", "run_id": spec["run_id"], "model": spec["model"], "world_size": 1,
            "precision": spec["precision"], "device_name": device_name, "n_params": n_params, "seq_len": seq_len,
            "micro_batch": ctx.micro_batch, "grad_accum": ctx.accum, "effective_batch": ctx.effective_batch,
            "steps": steps, "timed_steps": steps - warmup, "timed_s": seconds,
            "step_time_s": seconds / (steps - warmup), "tokens_per_s": tokens_per_s, "flops_per_token": fpt,
            "mfu": M.mfu(fpt, tokens_per_s, 1, device_name),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
            "initial_loss": losses[0], "final_loss": losses[-1], "losses": losses, "settings": s,
            "torch_version": torch.__version__}


def synchronised_now(cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="the run spec (workflow_scripts.study.run_spec's format)")
    spec = json.loads(Path(ap.parse_args(argv).spec).read_text())
    summary = run(spec)
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
