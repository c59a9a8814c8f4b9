# Stages 1-3 for image studies (data.kind: images): labelled images -> resized uint8 rows + manifest, in the
# places the token blocks take for text (workflow_scripts/data/images.py).
rule images:
    output:
        train=f"{D}/train.npy",
        val=f"{D}/val.npy",
        manifest=f"{D}/tokens_manifest.json",
    log:
        f"{D}/logs/images.log",
    container:
        IMAGE
    params:
        images=json.dumps(config["images"], sort_keys=True),
        val_fraction=config["data"]["val_fraction"],
    shell:
        "python3 -m workflow_scripts.data.images --params {params.images:q} --val-fraction {params.val_fraction} "
        "--train {output.train:q} --val {output.val:q} --manifest {output.manifest:q} > {log:q} 2>&1"
