"""The host's readying of a micro-batch against the step-time model's input term (plan/step_time.input_seconds):
the real training.batches.Batches over memory-mapped rows (gathered, widened to int64, pinned where a GPU takes
them, copied to the device), timed per micro-batch, beside the bytes the model counts a sample
(plan.predict.host_copy_bytes) over this host's copy bandwidth measured in the same round
(calibrate.host_memcpy_gbs, what a calibration records as `host_memcpy`). Shapes: a ViT-Base micro-batch of 64
images of 224 x 224, a ViT-Huge one of 32, a GPT-2 one of 8 blocks of 1,024 tokens; rounds interleaved (the shapes'
order reversed every other round).

    python -m workflow_scripts.bench.input_copy [--rounds 3] [--batches 8] [--out DIR]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from workflow_scripts.data.images import ROW_DTYPE
from workflow_scripts.data.tokenize import token_dtype

VOCAB = 50257  # GPT-2's: its token blocks' stored width (data.tokenize.token_dtype)
# (name, model whose rows they are, values a stored row, stored dtype, micro-batch)
SHAPES = (("vit-base-16, 64 images", "vit-base-16", 1 + 3 * 224 * 224, ROW_DTYPE, 64),
          ("vit-huge-14, 32 images", "vit-huge-14", 1 + 3 * 224 * 224, ROW_DTYPE, 32),
          ("gpt2, 8 x 1,024 tokens", "gpt2", 1024, token_dtype(VOCAB), 8))


def readying_s(blocks, micro: int, batches: int, device) -> float:
    """Seconds a micro-batch of `micro` rows takes through Batches.micro_batches onto `device` (synchronised at the
    end), the mean over `batches` micro-batches of one step each."""
    import torch

    from workflow_scripts.training.batches import Batches

    ctx = SimpleNamespace(effective_batch=micro, accum=1, dp_size=1, dp_rank=0, micro_batch=micro, device=device)
    feed = Batches(blocks, ctx, seed=0, pin=device.type == "cuda")
    for _ in feed.micro_batches(0):  # the first: pinned memory allocated, pages touched
        pass
    start = time.perf_counter()
    for step in range(1, batches + 1):
        for batch in feed.micro_batches(step):
            del batch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / batches


def measure(rounds: int, batches: int, work: Path):
    import numpy as np
    import pandas as pd
    import torch

    from workflow_scripts.bench.rounds import order
    from workflow_scripts.measure.calibrate import host_memcpy_gbs
    from workflow_scripts.plan.predict import host_copy_bytes

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    stored = {}
    for name, _, values, dtype, micro in SHAPES:
        path = work / f"{name.split(',')[0]}.npy"
        np.save(path, np.random.default_rng(0).integers(0, 255, (micro * (batches + 1), values), dtype=dtype))
        stored[name] = np.load(path, mmap_mode="r")
    rows = []
    for r in range(rounds):
        for name, model, values, _, micro in order(r, SHAPES):
            gbs = host_memcpy_gbs(5)
            seconds = readying_s(stored[name], micro, batches, device)
            predicted = micro * host_copy_bytes(model, values, VOCAB) / (gbs * 1e9)
            rows.append({"round": r, "shape": name, "host_memcpy_gbs": gbs, "measured_ms": 1e3 * seconds,
                         "predicted_ms": 1e3 * predicted, "ratio": seconds / predicted})
    return pd.DataFrame(rows), device


def table(rows) -> str:
    from workflow_scripts.report.stats import mean_ci

    lines = ["| shape | rounds | host_memcpy (GB/s) | measured ms a micro-batch | predicted | measured / predicted |",
             "|---|---|---|---|---|---|"]
    for shape, df in rows.groupby("shape", sort=False):
        m, ratio = mean_ci(df.measured_ms), mean_ci(df.ratio)
        lines.append(f"| {shape} | {m.n} | {df.host_memcpy_gbs.mean():.2f} | {m.mean:.2f} ± {m.half_width:.2f} | "
                     f"{df.predicted_ms.mean():.2f} | {ratio.mean:.2f} ± {ratio.half_width:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=8, help="micro-batches timed per shape and round")
    ap.add_argument("--out", type=Path, help="a folder: input_copy.csv and input_copy.md there")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows, device = measure(args.rounds, args.batches, Path(tmp))
    text = f"Device: {device}\n\n{table(rows)}"
    print(rows.to_string(index=False), text, sep="\n\n")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        rows.to_csv(args.out / "input_copy.csv", index=False)
        (args.out / "input_copy.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
