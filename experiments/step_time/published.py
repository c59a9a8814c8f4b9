"""The step-time model (plan/step_time.py) against published throughput of configurations we cannot rent:
torchtitan's Llama 3.1 8B with FSDP on 8 and on 128 H100 (pytorch/torchtitan, benchmarks/
llama3_h100_202412_torchtitan.md, Tables 1 and 3: local batch 2 x 8,192 tokens, selective activation checkpointing,
bf16 parameters and fp32 gradient reduction, eager and with each block compiled).

    python -m experiments.step_time.published [--out DIR]

The rates are those of the H100 kind (its rate file, workflow_scripts/plan/rates/h100.json: the GEMM and SDPA curves
and copies of an H100 we measured, the kind's median launch cost); the network is stated (plan/fabric.py: NVSwitch
inside a node of 8, one 400 Gb/s NIC per GPU between nodes,
as the benchmark's Grand Teton hosts). Their H100 differ from ours (96 GB HBM2e at 2.4 TB/s and a 500 W power limit,
against 80 GB HBM3 at 3.35 TB/s and 700 W): a part of any error is the machine, which no calibration of ours sees.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from workflow_scripts.measure.metrics import mfu
from workflow_scripts.plan import memory_model as mm
from workflow_scripts.plan import step_time as st
from workflow_scripts.plan.fabric import Fabric

CALIBRATION = st.RATES / "h100.json"
# Llama 3.1 8B as published (meta-llama/Llama-3.1-8B config.json): 32 layers, hidden 4096, MLP 14336, 32 heads of
# 128, 8 KV heads, vocabulary 128,256, untied embeddings; 8.03 B parameters
LLAMA_8B = mm.Shape("llama", n_params=8_030_261_248, n_layer=32, d=4096, ffn=14336, kv=1024, head_dim=128,
                    vocab=128256, tied=False)
SEQ, LOCAL_BATCH = 8192, 2
# (GPUs, levers, published tokens/s per GPU)
PUBLISHED = [(8, "eager", 5762), (8, "blocks", 6667), (128, "eager", 5605), (128, "blocks", 6514)]
FABRIC = Fabric(gpus_per_node=8, intra_node_busbw_gbs=360.0, inter_node_gbs=45.0, intra_node_latency_us=5.0,
                inter_node_latency_us=10.0)


def run(gpus: int, levers: str) -> st.Run:
    return st.Run(shape=LLAMA_8B, family="fsdp", zero_stage=3, strategy="fsdp", micro_batch=LOCAL_BATCH, accum=1,
                  tokens=SEQ, layout={"dp": gpus}, levers=levers, compile_loss=False, checkpointing=True,
                  selective=True, matmuls_recomputed=0.5, trainable=LLAMA_8B.n_params,
                  tensors=9 * LLAMA_8B.n_layer + 3)


def flops_per_token() -> float:
    """6N + 12 L d T (the MFU convention of measure/metrics.py and training/models.py)."""
    s = LLAMA_8B
    return 6.0 * s.n_params + 12.0 * s.n_layer * s.d * SEQ


def table() -> str:
    rates = st.load_rates(CALIBRATION)
    lines = ["| GPUs | torchtitan | published tokens/s per GPU | predicted | error | predicted MFU | bound | "
             "parts (s): gemm / attention / memory / optimizer / host / comm |", "|---|---|---|---|---|---|---|---|"]
    errors = []
    for gpus, levers, published in PUBLISHED:
        p = st.predict(run(gpus, levers), rates, FABRIC)
        tokens = LOCAL_BATCH * SEQ / p.step_s
        errors.append(tokens / published - 1)
        parts = " / ".join(f"{p.parts[k]:.3f}" for k in ("gemm", "attention", "memory", "optimizer", "host", "comm"))
        lines.append(f"| {gpus} | FSDP{' + torch.compile' if levers == 'blocks' else ''} | {published:,} | "
                     f"{tokens:,.0f} | {errors[-1]:+.1%} | {mfu(flops_per_token(), tokens, 1, rates.device):.1%} "
                     f"| {p.bound} | {parts} |")
    mean = sum(abs(e) for e in errors) / len(errors)
    return "\n".join([f"Rates: {rates.device}, the kind's rate file `plan/rates/{CALIBRATION.name}` (median launch "
                      f"cost {rates.launch_us:.1f} µs); network: {FABRIC.describe()}.", "",
                      *lines, "", f"Mean absolute error: {mean:.1%} over {len(errors)} published rows."])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="a folder: writes published.md there")
    args = ap.parse_args(argv)
    text = table()
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "published.md").write_text("# The step-time model against published throughput\n\n" + text + "\n")


if __name__ == "__main__":
    main()
