"""ZeRO-3's gradients with its blocks as leaf modules, eager and compiled, or its whole model compiled, against plain
ZeRO-3 (one process).

    python -m experiments.zero3_grads.zero3_grad_check --model vit-huge-14 --precision bf16-mixed --steps 4 \
        [--out check.json]

Each variant builds the model from one seed, wraps it in a DeepSpeed ZeRO-3 engine (stage 3, the precision's
section as the strategies write it: bf16-mixed -> torch_autocast, bf16-pure -> bf16), runs the same batches and
records the loss of every step, the full gradient of every parameter after the first backward
(deepspeed.utils.safe_get_full_grad) and, for leaf modules, how many parameters DeepSpeed's leaf hook found without a
gradient (it reduces zeros for those). The gradients are compared with the first variant's. Not a pipeline stage: it
found why ZeRO-3 with compiled blocks followed another loss trajectory on a GPU (DeepSpeed's memory-efficient
linear traced into the blocks; README.md here).
"""
from __future__ import annotations

import argparse
import json
import os

import torch

VARIANTS = {  # name: (leaf modules, compiled: blocks (True, "fullgraph") or "engine", memory_efficient_linear)
    "zero3": (False, False, True),
    "zero3_leaf": (True, False, True),
    "zero3_leaf_compiled": (True, True, True),
    "zero3_compiled": (False, True, True),
    "zero3_leaf_fullgraph": (True, "fullgraph", True),
    "zero3_leaf_compiled_plain_linear": (True, True, False),
    "zero3_leaf_fullgraph_plain_linear": (True, "fullgraph", False),
    # the whole model compiled by DeepSpeedEngine.compile (train.compile_model's path for ZeRO-3, without DeepCompile)
    "zero3_engine_compile": (False, "engine", True),
    "zero3_engine_compile_plain_linear": (False, "engine", False),
    # DeepSpeed's DeepCompile (its `compile` section, engine.compile): the gathers and releases inside the graph, with
    # DeepSpeed's memory-efficient linear as the pipeline keeps it there (GPU only)
    "zero3_deepcompile": (False, "deepcompile", True),
}


def batches(model_name: str, family: str, cfg, micro: int, steps: int, device) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        if family == "vit":
            x = torch.randn(micro, 3, cfg.image_size, cfg.image_size, generator=g)
            y = torch.randint(0, cfg.num_labels, (micro,), generator=g)
            out.append({"pixel_values": x.to(device), "labels": y.to(device)})
        else:
            t = torch.randint(0, cfg.vocab_size, (micro, 256), generator=g).to(device)
            out.append({"input_ids": t, "labels": t})
    return out


COUNTS: dict = {}  # the running variant's
HOOKED: set = set()  # leaf modules whose gradient-reduce hook ran in this backward
LATE: list = []  # leaf parameters whose gradient was accumulated after their module's hook ran


def none_grad_counter() -> None:
    """Count leaf parameters DeepSpeed's leaf hook met without a gradient (it substitutes zeros) or with zeros."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    original = Stage3.reduce_ready_partitions_and_remove_grads
    if getattr(original, "_counted", False):
        return

    def counted(self, param, *a, **k):
        if getattr(param, "ds_z3_leaf_module", None) is not None:
            COUNTS["leaf_reduced"] = COUNTS.get("leaf_reduced", 0) + 1
            HOOKED.add(id(param.ds_z3_leaf_module))
            if param.grad is None or not bool(param.grad.any()):
                COUNTS["leaf_zero_grad"] = COUNTS.get("leaf_zero_grad", 0) + 1
        return original(self, param, *a, **k)

    counted._counted = True
    Stage3.reduce_ready_partitions_and_remove_grads = counted


def run_variant(name: str, args, device) -> dict:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad, set_z3_leaf_modules

    from workflow_scripts.training.models import MODELS, build_config, build_model, transformer_blocks

    leaf, compiled, mem_linear = VARIANTS[name]
    if not mem_linear:  # an earlier variant's zero.Init replaced F.linear for the whole process: put torch's back
        from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as Patcher

        torch.nn.functional.linear = getattr(Patcher, "linear_bk", torch.nn.functional.linear)
    torch._dynamo.reset()
    torch.manual_seed(0)
    family = MODELS[args.model].family
    size = 3 * args.image * args.image + 1 if family == "vit" else 256
    classes_or_vocab = 1000 if family == "vit" else 50304
    depth = {("n_layer" if family == "gpt2" else "num_hidden_layers"): args.layers} if args.layers else None
    model = build_model(args.model, classes_or_vocab, size, overrides=depth)
    cfg = build_config(args.model, classes_or_vocab, size, depth)
    blocks = transformer_blocks(model)
    if leaf:
        set_z3_leaf_modules(model, [type(blocks[0])])
    if compiled in (True, "fullgraph"):
        for block in blocks:
            block.forward = torch.compile(block.forward, fullgraph=compiled == "fullgraph")
    ds = {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": 1,
          "train_batch_size": args.micro, "gradient_clipping": 1.0, "zero_allow_untested_optimizer": True,
          "zero_optimization": {"stage": 3, "overlap_comm": False, "memory_efficient_linear": mem_linear,
                                **json.loads(args.zero)},
          "steps_per_print": 10**9}
    if compiled == "deepcompile":
        ds["compile"] = {"deepcompile": True}
    if args.precision == "bf16-pure":
        ds["bf16"] = {"enabled": True}
    elif args.precision == "bf16-mixed":
        ds["torch_autocast"] = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    if compiled in ("engine", "deepcompile"):
        engine.compile()
    COUNTS.clear()
    # the counter reads every gradient (a device sync per parameter): not while profiling, nor around DeepCompile's
    # graph, which reduces the gradients in its own ops
    if not args.profile and compiled != "deepcompile":
        none_grad_counter()
    names = {p: n for n, p in engine.module.named_parameters()}
    if leaf and not args.profile:
        for p in engine.module.parameters():
            p.register_post_accumulate_grad_hook(late_accumulation(names[p]))
    losses, grads, stale = [], {}, 0
    profiler = None
    for i, batch in enumerate(batches(args.model, family, cfg, args.micro, args.steps, device)):
        if args.profile and i == args.steps - args.profile:  # the host's time per function over the last steps
            import cProfile

            torch.cuda.synchronize() if device.type == "cuda" else None
            profiler = cProfile.Profile()
            profiler.enable()
        loss = engine(**batch).loss
        HOOKED.clear()
        engine.backward(loss)
        if i == 0:
            stale = sum(p.grad is not None for p in engine.module.parameters())  # ZeRO-3 leaves none after reduce
            grads = {names[p]: safe_get_full_grad(p).float().cpu() for p in engine.module.parameters()}
        engine.step()
        losses.append(float(loss))
    if profiler is not None:
        torch.cuda.synchronize() if device.type == "cuda" else None
        profiler.disable()
        host_profile(profiler, f"{args.out or 'zero3_grad_check'}.{name}.profile.txt")
    engine.destroy()
    linear = torch.nn.functional.linear.__qualname__  # DeepSpeed's zero.Init may have replaced it
    late = sorted(set(LATE))
    LATE.clear()
    return {"losses": losses, "grads": grads, "counts": dict(COUNTS), "param_grad_left_after_backward": stale,
            "accumulated_after_leaf_hook": late, "functional_linear": linear}


def host_profile(profiler, path: str) -> None:
    """The profiled steps' host time by function: the 40 largest by own time and by cumulative time."""
    import io
    import pstats

    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    with open(path, "w") as f:
        f.write(out.getvalue())


def late_accumulation(name: str):
    def hook(param):
        if id(getattr(param, "ds_z3_leaf_module", None)) in HOOKED:
            LATE.append(name)
    return hook


def compare(ref: dict, other: dict, top: int = 8) -> dict:
    """Each gradient's relative L2 distance from the reference's; a gradient DeepSpeed does not give back whole
    (safe_get_full_grad under DeepCompile returns an empty tensor: its graph reduces them itself) is counted
    unreadable, not compared."""
    rel, unreadable = {}, [n for n, g in ref.items() if other[n].shape != g.shape]
    for n, g in ref.items():
        if n not in unreadable:
            rel[n] = float((other[n] - g).norm()) / max(float(g.norm()), 1e-30)
    worst = sorted(rel.items(), key=lambda kv: -kv[1])[:top]
    zero = [n for n, g in other.items() if n not in unreadable and not bool(g.any())]
    return {"max_rel_l2": worst[0][1] if worst else None,
            "median_rel_l2": sorted(rel.values())[len(rel) // 2] if rel else None, "worst": worst,
            "all_zero_grads": len(zero), "all_zero": zero, "unreadable_grads": len(unreadable)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit-tiny")
    ap.add_argument("--precision", default="bf16-mixed", choices=["fp32", "bf16-mixed", "bf16-pure"])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layers", type=int, help="the model's depth instead of its registry depth")
    ap.add_argument("--zero", default="{}",
                    help="more zero_optimization keys, JSON (ZeRO++: zero_quantized_weights...)")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the host over this many last steps")
    ap.add_argument("--out")
    args = ap.parse_args()
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    results = {v: run_variant(v, args, device) for v in args.variants.split(",")}
    first = next(iter(results))
    report = {"model": args.model, "precision": args.precision, "zero": json.loads(args.zero),
              "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "deepspeed": deepspeed.__version__, "reference": first, "variants": {}}
    for v, r in results.items():
        report["variants"][v] = {"losses": r["losses"], "counts": r["counts"],
                                 "param_grad_left_after_backward": r["param_grad_left_after_backward"],
                                 "accumulated_after_leaf_hook": r["accumulated_after_leaf_hook"],
                                 "functional_linear": r["functional_linear"],
                                 "grads_vs_reference": compare(results[first]["grads"], r["grads"])}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
