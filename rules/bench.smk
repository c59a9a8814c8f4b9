# Harness benchmark, not part of `all`:
#   snakemake --cores all bench_harness --configfile studies/bench_harness.yaml
# workflow_scripts/bench/harness.py, in two jobs: the lever ladder (bench_levers), then ours vs Hugging Face
# Trainer per strategy (bench_compare). Each fits a 10-minute GPU command on its own.
rule bench_part:
    input:
        train=DATA["train"],
        val=DATA["val"],
        manifest=DATA["manifest"],
        ops=bench_ops,
    output:
        csv=f"{R}/bench/{{table}}.csv",
        md=f"{R}/bench/{{table}}.md",
    log:
        f"{R}/logs/bench/{{table}}.log",
    wildcard_constraints:
        table="|".join(BENCH_PARTS.values()),
    container:
        IMAGE
    threads: 4 * config["bench"]["world_size"]
    resources:
        gpu=0 if PLATFORM == "cpu" else config["bench"]["world_size"],
        timed_runs=1,
    params:
        cfg=lambda w: json.dumps(
            bench_config(BENCH_PART_OF[w.table]), sort_keys=True, default=str
        ),
        part=lambda w: BENCH_PART_OF[w.table],
        out=lambda w, output: os.path.dirname(output.csv),
    shell:
        "python3 -m workflow_scripts.bench.harness --config-json {params.cfg:q} --part {params.part} "
        "--out-dir {params.out:q} > {log:q} 2>&1"


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


# Sampler overhead, not part of `all`: the same run with the VRAM sampler on and off, interleaved over bench.rounds.
rule bench_sampler:
    input:
        train=DATA["train"],
        val=DATA["val"],
        manifest=DATA["manifest"],
        ops=bench_ops,
    output:
        csv=f"{R}/bench/sampler_overhead.csv",
        md=f"{R}/bench/sampler_overhead.md",
    log:
        f"{R}/logs/bench/sampler_overhead.log",
    container:
        IMAGE
    threads: 4 * config["bench"]["world_size"]
    resources:
        gpu=0 if PLATFORM == "cpu" else config["bench"]["world_size"],
        timed_runs=1,
    params:
        cfg=json.dumps(bench_config("sampler"), sort_keys=True, default=str),
        out=lambda w, output: os.path.dirname(output.csv),
    shell:
        "python3 -m workflow_scripts.bench.sampler --config-json {params.cfg:q} --out-dir {params.out:q} > {log:q} 2>&1"
