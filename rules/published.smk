# With config `published`: a publication's numbers against this study. The as-published variant re-runs the claimed
# (model, strategy) pairs with the publication's own settings (its confounds included) into {R}/as_published, parsed
# on its own so it never enters the fair tables; then the claims table and figure (workflow_scripts/report/claims.py).


use rule train as train_as_published with:
    input:
        train=DATA["train"],
        val=DATA["val"],
        manifest=DATA["manifest"],
        ops=ops_for,
        calibration=ancient(f"{R}/{columns.CALIBRATION}"),
        lever_trial=lever_trial_of,
        random_init=lambda w: random_init_of(published_spec(w)),
    output:
        summary=f"{AS_PUBLISHED_RUN}/summary.json",
        metrics=f"{AS_PUBLISHED_RUN}/metrics.csv",
        vram=f"{AS_PUBLISHED_RUN}/vram.csv",
        settings=f"{AS_PUBLISHED_RUN}/strategy_settings.json",
        provenance=f"{AS_PUBLISHED_RUN}/provenance.json",
    log:
        f"{AS_PUBLISHED}/logs/train/{{model}}/{{strategy}}/{{layout}}/r{{repeat}}.log",
    params:
        spec=published_run_spec,


use rule parse as parse_as_published with:
    input:
        summaries=expand("{run}/summary.json", run=published_run_dirs()),
        metrics=expand("{run}/metrics.csv", run=published_run_dirs()),
        vram=expand("{run}/vram.csv", run=published_run_dirs()),
        calibration=rules.calibrate.output.json,
    output:
        runs=f"{AS_PUBLISHED}/{columns.RUNS_TABLE}",
        steps=f"{AS_PUBLISHED}/tables/steps.csv",
        vram=f"{AS_PUBLISHED}/tables/vram.csv",
        runs_parquet=f"{AS_PUBLISHED}/tables/runs.parquet",
        steps_parquet=f"{AS_PUBLISHED}/tables/steps.parquet",
        vram_parquet=f"{AS_PUBLISHED}/tables/vram.parquet",
        provenance=f"{AS_PUBLISHED}/tables/provenance.md",
        provenance_csv=f"{AS_PUBLISHED}/tables/provenance.csv",
        provenance_parquet=f"{AS_PUBLISHED}/tables/provenance.parquet",
    log:
        f"{AS_PUBLISHED}/logs/parse.log",
    params:
        runs=published_run_dirs(),


rule claims:
    input:
        fair=rules.parse.output.runs,
        as_published=f"{AS_PUBLISHED}/{columns.RUNS_TABLE}",
        code=stage_code("report.claims", "report.style", "report.tables"),
    output:
        csv=f"{R}/tables/claims.csv",
        headlines=f"{R}/tables/claims_headlines.csv",
        md=report(
            f"{R}/tables/claims.md",
            caption="../report/captions/claims.rst",
            category="Tables",
        ),
        png=report(
            f"{R}/figures/claims.png",
            caption="../report/captions/claims.rst",
            category="Figures",
        ),
        pdf=f"{R}/figures/claims.pdf",
    log:
        f"{R}/logs/claims.log",
    container:
        IMAGE
    params:
        published=json.dumps(config["published"], sort_keys=True),
        style=json.dumps(config["figures"], sort_keys=True),
    shell:
        "python3 -m workflow_scripts.report.claims --fair {input.fair:q} --as-published {input.as_published:q} "
        "--published {params.published:q} --style {params.style:q} --out-csv {output.csv:q} --out-md {output.md:q} "
        "--out-headlines {output.headlines:q} "
        "--figure {output.png:q} > {log:q} 2>&1"
