# Machine calibration, once per study and machine, before the timed runs (an input of every run, `ancient`: a
# recalibration never reruns a finished run): workflow_scripts/measure/calibrate.py.


rule calibrate:
    input:
        # after the data preparation and the op builds, which share the host with it (a host busy with the
        # tokenizer measures a slower launch cost); their outputs only order it (ancient: a new data preparation
        # never recalibrates)
        data=ancient(DATA["manifest"]),
        ops=ancient(study_ops()),
    output:
        json=f"{R}/{columns.CALIBRATION}",
        md=report(
            f"{R}/calibration/calibration.md",
            caption="../report/captions/calibration.rst",
            category="Provenance",
        ),
    log:
        f"{R}/logs/calibrate.log",
    container:
        IMAGE
    threads: max(node_world_sizes() + [1]) * (1 if PLATFORM == "cpu" else 4)
    resources:
        gpu=0 if PLATFORM == "cpu" else max(node_world_sizes() + [1]),
        timed_runs=1,
    params:
        platform=PLATFORM,
        sizes=",".join(map(str, node_world_sizes())),
        work=f"{W}/calibration",
    shell:
        "python3 -m workflow_scripts.measure.calibrate --platform {params.platform} "
        "--world-sizes {params.sizes:q} --work-dir {params.work:q} --out {output.json:q} --md {output.md:q} "
        "> {log:q} 2>&1"


rule calibration_figure:
    input:
        json=rules.calibrate.output.json,
        code=stage_code("report.calibration", "report.style"),
    output:
        png=report(
            f"{R}/figures/calibration.png",
            caption="../report/captions/calibration.rst",
            category="Figures",
        ),
        pdf=f"{R}/figures/calibration.pdf",
    log:
        f"{R}/logs/calibration_figure.log",
    container:
        IMAGE
    params:
        style=json.dumps(config["figures"], sort_keys=True),
    shell:
        "python3 -m workflow_scripts.report.calibration --calibration {input.json:q} --style {params.style:q} "
        "--figure {output.png:q} > {log:q} 2>&1"
