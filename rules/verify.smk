# Reproduction check, not part of `all`: the study's rows regenerated into its results_dir (the committed runs'
# decisions replayed: workflow_scripts/replay.py), compared with the committed set in verify.against
# (workflow_scripts/report/verify.py). Every committed file the comparison reads is an input, so editing the
# committed set compares again; target `verify` fails when a row is neither reproduced nor explained, and the
# comparison's table stays.
rule compare_with_committed:
    input:
        runs=rules.parse.output.runs,
        calibration=f"{R}/{columns.CALIBRATION}",
        committed=committed_files,
    output:
        csv=f"{R}/verify/reproduction.csv",
        md=report(
            f"{R}/verify/reproduction.md",
            caption="../report/captions/reproduction.rst",
            category="Provenance",
        ),
    log:
        f"{R}/logs/verify.log",
    container:
        IMAGE
    params:
        against=config["verify"]["against"] or "",
        tolerances=json.dumps(config["verify"]["tolerances"]),
        across=config["verify"]["across_kinds"],
        rerun=lambda w, input: os.path.dirname(os.path.dirname(input.runs)),
        out=lambda w, output: os.path.dirname(output.csv),
    shell:
        "python3 -m workflow_scripts.report.verify --rerun {params.rerun:q} --against {params.against:q} "
        "--tolerances {params.tolerances:q} --across-kinds {params.across} --out-dir {params.out:q} > {log:q} 2>&1"


rule verify:
    input:
        rules.compare_with_committed.output.csv,
    output:
        f"{R}/verify/passed",
    log:
        f"{R}/logs/verify_check.log",
    container:
        IMAGE
    shell:  # bash's pipefail ends the job with verify's exit status: `passed` only when every run passed
        "python3 -m workflow_scripts.report.verify --check {input:q} 2>&1 | tee {log:q}; "
        "date -u +%FT%TZ > {output:q}"
