# The prepared data's manifests (source, documents, bytes and hashes; token counts or image rows) copied from the
# shared data folder (study.data_dir) into the study's results, where runs, tables and verify read them.
rule data_manifests:
    input:
        [f"{D}/{name}" for name in study.DATA_MANIFESTS[config["data"]["kind"]]],
    output:
        [f"{R}/data/{name}" for name in study.DATA_MANIFESTS[config["data"]["kind"]]],
    localrule: True
    run:
        import shutil

        for source, copy in zip(input, output):
            shutil.copyfile(source, copy)
