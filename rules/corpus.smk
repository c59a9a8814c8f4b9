# Stage 1: text from the configured source -> normalised JSONL + manifest (source, documents, bytes, sha256).
rule corpus:
    output:
        jsonl=f"{D}/corpus.jsonl",
        manifest=f"{D}/corpus_manifest.json",
    log:
        f"{D}/logs/corpus.log",
    container:
        IMAGE
    params:
        corpus=json.dumps(config["corpus"], sort_keys=True),
    shell:
        "python3 -m workflow_scripts.data.corpus --params {params.corpus:q} --jsonl {output.jsonl:q} "
        "--manifest {output.manifest:q} > {log:q} 2>&1"
