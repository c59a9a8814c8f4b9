# Stage 3b: each random initialisation the runs start from, built once beside the data it was built for
# (workflow_scripts/training/random_init.py; the job: workflow_scripts/job/random_init.py): every rank, repeat's
# run and lever-trial candidate that starts from it loads it instead of drawing its weights again; a run from
# pretrained weights has none.
rule random_init:
    input:
        train=f"{D}/train.npy",
        val=f"{D}/val.npy",
        manifest=f"{D}/tokens_manifest.json",
    output:
        directory(f"{D}/random_init/{{model}}-{{key}}"),
    log:
        f"{D}/logs/random_init/{{model}}-{{key}}.log",
    wildcard_constraints:
        key="[0-9a-f]{16}",
    container:
        IMAGE
    params:
        recipe=lambda w, output: json.dumps(RANDOM_INITS[output[0]], sort_keys=True),
    shell:
        "python3 -m workflow_scripts.job.random_init --recipe-json {params.recipe:q} --out {output:q} --log {log:q}"
