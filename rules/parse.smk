# Stage 5: every run's files -> tidy tables (runs, steps, sampler timelines), CSV + Parquet.
rule parse:
    input:
        summaries=expand("{run}/summary.json", run=run_dirs()),
        metrics=expand("{run}/metrics.csv", run=run_dirs()),
        vram=expand("{run}/vram.csv", run=run_dirs()),
    output:
        runs=report(f"{R}/tables/runs.csv", caption="../report/captions/runs.rst", category="Tables"),
        steps=f"{R}/tables/steps.csv",
        vram=f"{R}/tables/vram.csv",
        runs_parquet=f"{R}/tables/runs.parquet",
        steps_parquet=f"{R}/tables/steps.parquet",
        vram_parquet=f"{R}/tables/vram.parquet",
    log:
        f"{R}/logs/parse.log",
    params:
        runs=run_dirs(),
    container:
        IMAGE
    shell:
        "python -m workflow_scripts.parse --runs {params.runs} --out-dir $(dirname {output.runs}) > {log} 2>&1"
