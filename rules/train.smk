# Stage 4: one job per (model x strategy x layout x repeat): torchrun ranks + the VRAM sampler.
# DeepSpeed ops are built once per op (build_op) before any rank starts; builds never enter a timing.


rule build_op:
    output:
        f"{W}/ops/{{op}}.json",
    log:
        f"{R}/logs/ops/{{op}}.log",
    container:
        IMAGE
    params:
        platform=PLATFORM,
    shell:
        "python3 -m workflow_scripts.training.build_ops "
        "--op {wildcards.op} --platform {params.platform} --out {output:q} > {log:q} 2>&1"


# Measured `auto` levers (config auto_levers.by; its default measures on one GPU node): one trial per configuration
# before its repeats, each candidate lever set a few steps on this machine, or the decision cached for this shape,
# device and software (workflow_scripts/job/lever_trial.py); the runs read the verdict.
rule lever_trial:
    input:
        train=DATA["train"],
        val=DATA["val"],
        manifest=DATA["manifest"],
        ops=ops_for,
        random_init=lambda w: random_init_of(fair_spec(RunWildcards(**w, repeat="0"))),
    output:
        f"{R}/{columns.LEVER_TRIAL}",
    log:
        f"{R}/logs/levers/{{model}}/{{strategy}}/{{layout}}.log",
    container:
        IMAGE
    threads: train_threads
    resources:
        gpu=train_gpus,
        timed_runs=1,
    params:
        plan=lever_trial_plan,
    shell:
        "python3 -m workflow_scripts.job.lever_trial --trial {params.plan:q} --out {output:q} --log {log:q}"


rule train:
    input:
        train=DATA["train"],
        val=DATA["val"],
        manifest=DATA["manifest"],
        ops=ops_for,
        calibration=ancient(f"{R}/{columns.CALIBRATION}"),
        lever_trial=lever_trial_of,
        random_init=lambda w: random_init_of(fair_spec(w)),
    output:
        **({"traces": directory(TRACES)} if PROFILE else {}),
        summary=f"{RUN}/summary.json",
        metrics=f"{RUN}/metrics.csv",
        vram=f"{RUN}/vram.csv",
        settings=f"{RUN}/strategy_settings.json",
        provenance=f"{RUN}/provenance.json",
    log:
        f"{R}/logs/train/{{model}}/{{strategy}}/{{layout}}/r{{repeat}}.log",
    container:
        IMAGE
    threads: train_threads
    resources:
        gpu=train_gpus,
        nodes=config["nodes"],
        timed_runs=1,  # profiles set --resources timed_runs=1: timed runs never share a machine
    params:
        spec=run_spec,
        # one launcher per node; --overlap: the SLURM jobstep's own step already holds the job's CPUs
        launcher=(
            "srun --overlap --ntasks-per-node=1 --nodes={} ".format(config["nodes"])
            if config["nodes"] > 1
            else ""
        ),
    shell:
        "{params.launcher}python3 -m workflow_scripts.job.launch --spec {params.spec:q} --log {log:q}"
