# Harness benchmark, not part of `all`:
#   snakemake --cores all bench_harness --configfile studies/bench_harness.yaml
# workflow_scripts/bench_harness.py, in two jobs: the lever ladder (bench_levers), then ours vs Hugging Face
# Trainer per strategy (bench_compare). Each fits a 10-minute GPU command on its own.
BENCH_PARTS = {"levers": "levers", "compare": "harness_vs_trainer"}


def bench_ops(wildcards):
    from workflow_scripts.build_ops import needed_ops

    b = config["bench"]
    names = sorted({op for s in set(b["strategies"]) | {b["lever_strategy"]} for op in needed_ops(s, PLATFORM)})
    return expand(f"{W}/ops/{{op}}.json", op=names)


def bench_config(table):
    """The config one part depends on: no figure/table style, and not the other part's keys (editing the lever
    list never reruns the Trainer comparison, and the other way round)."""
    other = ("strategies", "harness") if table == "levers" else ("levers", "lever_strategy")
    cfg = {k: v for k, v in config.items() if k not in ("figures", "tables")}
    cfg["bench"] = {k: v for k, v in config["bench"].items() if k not in other}
    return cfg


rule bench_part:
    input:
        train=rules.tokenize.output.train,
        val=rules.tokenize.output.val,
        manifest=rules.tokenize.output.manifest,
        ops=bench_ops,
    output:
        csv=f"{R}/bench/{{table}}.csv",
        md=f"{R}/bench/{{table}}.md",
    log:
        f"{R}/logs/bench/{{table}}.log",
    wildcard_constraints:
        table="|".join(BENCH_PARTS.values()),
    params:
        cfg=lambda w: json.dumps(bench_config(w.table), sort_keys=True, default=str),
        part=lambda w: {v: k for k, v in BENCH_PARTS.items()}[w.table],
        out=f"{R}/bench",
    threads: 4 * config["bench"]["world_size"]
    resources:
        gpu=0 if PLATFORM == "cpu" else config["bench"]["world_size"],
        timed_runs=1,
    container:
        IMAGE
    shell:
        "python3 -m workflow_scripts.bench_harness --config-json {params.cfg:q} --part {params.part} "
        "--out-dir {params.out} > {log} 2>&1"


rule bench_levers:
    input:
        f"{R}/bench/levers.csv",


rule bench_compare:
    input:
        f"{R}/bench/harness_vs_trainer.csv",


rule bench_harness:
    input:
        rules.bench_levers.input,
        rules.bench_compare.input,
