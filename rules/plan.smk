# Before anything runs (not part of `all`; needs no data, no GPU and no network): `plan`, what fits on the plan's
# GPU counts (the analytic memory model, workflow_scripts/plan/planner.py), printed, and ranked by the step-time
# model where plan.calibration names a GPU kind (its rate file, workflow_scripts/plan/rates/) or a calibration;
# `scale`, the study at the GPU counts and on the network of plan.scale (workflow_scripts/plan/scale.py: every
# layout that fits, simulated; its figure: report/scale_figure.py).
rule plan:
    input:
        calibration=plan_calibration,
    output:
        csv=f"{R}/plan/plan.csv",
        md=f"{R}/plan/plan.md",
    log:
        f"{R}/logs/plan.log",
    container:
        IMAGE
    params:
        config=lambda w: plan_config(),
        out=lambda w, output: os.path.dirname(output.csv),
    shell:
        "python3 -m workflow_scripts.plan.planner --config-json {params.config:q} --out-dir {params.out:q} "
        "> {log:q} 2>&1 && cat {output.md:q}"


rule scale:
    input:
        calibration=plan_calibration,
    output:
        csv=f"{R}/plan/scale.csv",
        md=f"{R}/plan/scale.md",
        png=report(
            f"{R}/plan/scale.png",
            caption="../report/captions/scale.rst",
            category="Plan",
        ),
        pdf=f"{R}/plan/scale.pdf",
    log:
        f"{R}/logs/scale.log",
    container:
        IMAGE
    params:
        config=lambda w: plan_config("figures"),
        out=lambda w, output: os.path.dirname(output.csv),
    shell:
        "(python3 -m workflow_scripts.plan.scale --config-json {params.config:q} --out-dir {params.out:q} && "
        "python3 -m workflow_scripts.report.scale_figure --csv {output.csv:q} --config-json {params.config:q}) "
        "> {log:q} 2>&1"
