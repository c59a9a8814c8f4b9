# Stage 5b, with config profile.enabled: each run's profiler traces (written by the train job into work_dir) ->
# the run's phase table and HTA breakdowns; then the study's trace table and figure.


rule analyse_traces:
    input:
        traces=TRACES,
    output:
        analysis=f"{RUN}/traces/analysis.json",
        phases=f"{RUN}/traces/phases.csv",
    log:
        f"{R}/logs/traces/{{model}}/{{strategy}}/{{layout}}/r{{repeat}}.log",
    container:
        IMAGE
    params:
        top=config["profile"]["top_kernels"],
    shell:
        "python3 -m workflow_scripts.report.traces analyse --traces {input.traces:q} --top {params.top} "
        '--out-dir "$(dirname {output.analysis:q})" > {log:q} 2>&1'


rule trace_report:
    input:
        analyses=[f"{d}/traces/analysis.json" for d in run_dirs()],
        code=stage_code("report.traces", "report.style"),
    output:
        table=f"{R}/tables/traces.csv",
        kernels=f"{R}/tables/traces_kernels.csv",
        idle=f"{R}/tables/traces_idle.csv",
        png=report(
            f"{R}/figures/traces.png",
            caption="../report/captions/traces.rst",
            category="Figures",
        ),
        pdf=f"{R}/figures/traces.pdf",
    log:
        f"{R}/logs/trace_report.log",
    container:
        IMAGE
    params:
        style=json.dumps(config["figures"], sort_keys=True),
    shell:
        "python3 -m workflow_scripts.report.traces report --analyses {input.analyses:q} --table {output.table:q} "
        "--figure {output.png:q} --style {params.style:q} > {log:q} 2>&1"
