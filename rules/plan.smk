# What fits, before anything runs (not part of `all`): the analytic memory model over the plan's strategies, GPU
# counts and micro-batches (workflow_scripts/plan/planner.py), ranked by the step-time model where plan.calibration
# names a calibration. Needs no data and no GPU.


rule plan:
    input:
        calibration=lambda w: config["plan"].get("calibration") or [],
    output:
        csv=f"{R}/plan/plan.csv",
        md=f"{R}/plan/plan.md",
    log:
        f"{R}/logs/plan.log",
    container:
        IMAGE
    params:
        config=lambda w: json.dumps(
            {
                k: config[k]
                for k in (
                    "plan",
                    "platform",
                    "train",
                    "data",
                    "images",
                    "tokenizer",
                    "models",
                    "strategies",
                    "world_sizes",
                    "groups",
                    "layouts",
                    "model_overrides",
                    "strategy_options",
                )
                if k in config
            },
            sort_keys=True,
        ),
        out=lambda w, output: os.path.dirname(output.csv),
    shell:
        "python3 -m workflow_scripts.plan.planner --config-json {params.config:q} --out-dir {params.out:q} "
        "> {log} 2>&1"
