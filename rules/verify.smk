# Reproduction check, not part of `all`: the study's rows regenerated into its results_dir, compared with the
# committed set in verify.against (workflow_scripts/report/verify.py).


rule verify:
    input:
        runs=rules.parse.output.runs,
        calibration=f"{R}/calibration/calibration.json",
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
        rerun=lambda w, input: os.path.dirname(os.path.dirname(input.runs)),
        out=lambda w, output: os.path.dirname(output.csv),
    shell:
        "python3 -m workflow_scripts.report.verify --rerun {params.rerun:q} --against {params.against:q} "
        "--tolerances {params.tolerances:q} --out-dir {params.out:q} > {log} 2>&1"
