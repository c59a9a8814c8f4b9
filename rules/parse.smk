# Stage 5: every run's files -> tidy tables (runs, steps, sampler timelines), CSV + Parquet.
rule parse:
    input:
        summaries=expand("{run}/summary.json", run=run_dirs()),
        metrics=expand("{run}/metrics.csv", run=run_dirs()),
        vram=expand("{run}/vram.csv", run=run_dirs()),
        calibration=rules.calibrate.output.json,
    output:
        runs=report(
            f"{R}/{columns.RUNS_TABLE}",
            caption="../report/captions/runs.rst",
            category="Tables",
        ),
        steps=f"{R}/tables/steps.csv",
        vram=f"{R}/tables/vram.csv",
        runs_parquet=f"{R}/tables/runs.parquet",
        steps_parquet=f"{R}/tables/steps.parquet",
        vram_parquet=f"{R}/tables/vram.parquet",
        provenance=report(
            f"{R}/tables/provenance.md",
            caption="../report/captions/provenance.rst",
            category="Provenance",
        ),
        provenance_csv=f"{R}/tables/provenance.csv",
        provenance_parquet=f"{R}/tables/provenance.parquet",
    log:
        f"{R}/logs/parse.log",
    container:
        IMAGE
    params:
        runs=run_dirs(),
    shell:
        'python3 -m workflow_scripts.report.parse --runs {params.runs:q} --out-dir "$(dirname {output.runs:q})" '
        "--calibration {input.calibration:q} > {log:q} 2>&1"
