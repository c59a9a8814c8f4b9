# Setup check, not part of `all`: `snakemake --cores 1 doctor` before spending GPU hours.
rule doctor:
    output:
        f"{R}/doctor.md",
    log:
        f"{R}/logs/doctor.log",
    container:
        IMAGE
    params:
        cfg=json.dumps(config, sort_keys=True, default=str),
    shell:
        "python3 -m workflow_scripts.doctor --config-json {params.cfg:q} --out {output:q} > {log:q} 2>&1"
