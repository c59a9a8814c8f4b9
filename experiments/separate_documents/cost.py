"""What train.separate_documents costs on a GPU: forward + backward of the ML815 shape (Qwen2.5-Coder-1.5B's
config, bf16 weights, SDPA, micro-batch 4 x 1024 tokens, no recomputation) over packed blocks of documents of
100-400 tokens, the block as one sequence (the model sees only input_ids) against its documents kept apart
(document_positions: transformers builds the block-diagonal mask from the position ids). Interleaved rounds; prints
one line per round and the mean ± 95 % CI ratio.

    python3 experiments/separate_documents/cost.py [--rounds 3] [--steps 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from workflow_scripts.training.strategies.engine import document_positions

EOS = 151643
SHAPE = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
             num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
             eos_token_id=EOS, bos_token_id=EOS)


def blocks(micro: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    ids = torch.randint(0, 150000, (micro, seq), generator=gen)
    for row in ids:
        at = 0
        while True:
            at += int(torch.randint(100, 401, (1,), generator=gen))
            if at >= seq:
                break
            row[at] = EOS
    return ids


def step_s(model, ids, positions, steps: int) -> float:
    times = []
    for _ in range(steps + 2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        kw = {"input_ids": ids} if positions is None else {"input_ids": ids, "position_ids": positions}
        out = model(**kw, labels=ids)
        out.loss.backward()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[2:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--micro", type=int, default=4)
    args = p.parse_args()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**SHAPE), torch_dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    ids = blocks(args.micro, 1024, torch.Generator().manual_seed(1)).cuda()
    positions = document_positions(ids, EOS)
    with torch.no_grad():  # the documents are apart: a token's logits differ once an earlier document is hidden
        apart = (model(input_ids=ids).logits - model(input_ids=ids, position_ids=positions).logits).abs().max()
    rows = []
    for r in range(args.rounds):
        packed = step_s(model, ids, None, args.steps)
        separate = step_s(model, ids, positions, args.steps)
        rows.append({"round": r, "packed_s": packed, "separate_s": separate, "ratio": separate / packed})
        print(json.dumps(rows[-1]), flush=True)
    ratios = [row["ratio"] for row in rows]
    half = 4.303 * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) == 3 else float("nan")
    tokens = args.micro * 1024
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "logit_max_abs_difference": float(apart),
           "packed_tokens_per_s": tokens / statistics.mean(r["packed_s"] for r in rows),
           "separate_tokens_per_s": tokens / statistics.mean(r["separate_s"] for r in rows),
           "ratio_mean": statistics.mean(ratios), "ratio_ci95": half, "rounds": rows}
    print(json.dumps(out), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "separate_documents.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
