# Stage 2: a hub tokenizer, or a byte-level BPE trained on the corpus (vocab size from config).
rule tokenizer:
    input:
        corpus=rules.corpus.output.jsonl,
    output:
        directory(f"{D}/tokenizer"),
    log:
        f"{D}/logs/tokenizer.log",
    container:
        IMAGE
    params:
        tokenizer=json.dumps(config["tokenizer"], sort_keys=True),
    shell:
        "python3 -m workflow_scripts.data.tokenizer --params {params.tokenizer:q} --corpus {input.corpus:q} "
        "--out {output:q} > {log:q} 2>&1"
