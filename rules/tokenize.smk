# Stage 3: packed fixed-length token blocks, train/validation split by document, token counts in a manifest.
rule tokenize:
    input:
        corpus=rules.corpus.output.jsonl,
        tokenizer=rules.tokenizer.output[0],
    output:
        train=f"{D}/train.npy",
        val=f"{D}/val.npy",
        manifest=f"{D}/tokens_manifest.json",
    log:
        f"{D}/logs/tokenize.log",
    container:
        IMAGE
    threads: 16  # capped by --cores
    params:
        block_size=config["data"]["block_size"],
        val_fraction=config["data"]["val_fraction"],
    shell:
        "python3 -m workflow_scripts.data.tokenize --corpus {input.corpus:q} --tokenizer {input.tokenizer:q} "
        "--block-size {params.block_size} --val-fraction {params.val_fraction} --threads {threads} "
        "--train {output.train:q} --val {output.val:q} --manifest {output.manifest:q} > {log:q} 2>&1"
