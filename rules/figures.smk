# Stage 6: seaborn figures (PNG + PDF), the paper's summary table and the findings (the report's first page,
# report/workflow.rst). Only figure/table settings are params here, so editing them reruns these rules and never
# a training job. The figures are those the registry says this study has data for (figure_registry.applies).


report: "../report/workflow.rst"


FIGURES = figure_registry.names("figures", config)


rule summary_table:
    input:
        runs=rules.parse.output.runs,
        code=stage_code("report.tables", "report.stats"),
    output:
        md=report(
            f"{R}/tables/summary.md",
            caption="../report/captions/summary.rst",
            category="Tables",
        ),
        tex=f"{R}/tables/summary.tex",
        csv=f"{R}/tables/summary.csv",
        comparisons=report(
            f"{R}/tables/comparisons.md",
            caption="../report/captions/comparisons.rst",
            category="Tables",
        ),
    log:
        f"{R}/logs/summary_table.log",
    container:
        IMAGE
    params:
        style=json.dumps(config["tables"], sort_keys=True),
        loss_tolerance=config["verify"]["tolerances"]["loss_abs"],  # the zero0 = ddp check
    shell:
        "python3 -m workflow_scripts.report.tables --runs {input.runs:q} --style {params.style:q} "
        '--loss-tolerance {params.loss_tolerance} --out-dir "$(dirname {output.md:q})" > {log:q} 2>&1'


rule figures:
    input:
        runs=rules.parse.output.runs,
        steps=rules.parse.output.steps,
        vram=rules.parse.output.vram,
        code=stage_code(
            "report.figures",
            "report.figure_registry",
            "report.style",
            "report.tables",
            "report.stats",
        ),
    output:
        png=[
            report(
                f"{R}/figures/{name}.png",
                caption=f"../report/captions/{name}.rst",
                category="Figures",
            )
            for name in FIGURES
        ],
        pdf=expand(f"{R}/figures/{{name}}.pdf", name=FIGURES),
    log:
        f"{R}/logs/figures.log",
    container:
        IMAGE
    params:
        style=json.dumps(config["figures"], sort_keys=True),
        names=",".join(FIGURES),
    shell:
        "python3 -m workflow_scripts.report.figures --runs {input.runs:q} --steps {input.steps:q} --vram {input.vram:q} "
        '--names {params.names} --style {params.style:q} --out-dir "$(dirname {output.png[0]:q})" > {log:q} 2>&1'


rule findings:
    input:
        runs=rules.parse.output.runs,
        verify=verified,
        levers=lever_trials,
        code=stage_code("report.findings", "report.tables", "report.stats"),
    output:
        md=report(
            f"{R}/tables/findings.md",
            caption="../report/captions/findings.rst",
            category="Tables",
        ),
        rst=f"{R}/tables/findings.rst",
    log:
        f"{R}/logs/findings.log",
    container:
        IMAGE
    params:
        study=config["study"],
        verify=lambda w, input: ["--verify", input.verify[0]] if input.verify else [],
    shell:
        "python3 -m workflow_scripts.report.findings --runs {input.runs:q} {params.verify:q} --study {params.study:q} "
        "--levers {input.levers:q} --md {output.md:q} --rst {output.rst:q} > {log:q} 2>&1"
