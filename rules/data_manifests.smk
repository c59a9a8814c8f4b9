# The prepared data's manifests (source, documents, bytes and hashes; token counts or image rows) copied from the
# shared data folder (study.data_dir) into the study's results, where runs, tables and verify read them.
rule data_manifests:
    input:
        [f"{D}/{name}" for name in study.DATA_MANIFESTS[config["data"]["kind"]]],
    output:
        [f"{R}/data/{name}" for name in study.DATA_MANIFESTS[config["data"]["kind"]]],
    log:
        f"{R}/logs/data_manifests.log",
    localrule: True
    container:
        IMAGE
    params:
        into=lambda w, output: os.path.dirname(output[0]),
    shell:
        "cp -v {input:q} {params.into:q}/ > {log:q} 2>&1"
