# Distributed-training study: corpus -> tokenizer -> token blocks -> training runs -> tables, figures, report.
#   snakemake --cores all                                   (the default study, config.yaml, CPU)
#   snakemake --cores all --configfile studies/<study>.yaml (a study; add --use-apptainer / --profile ...)
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "rules/common.smk"


if config["data"]["kind"] == "images":

    include: "rules/images.smk"

else:

    include: "rules/corpus.smk"
    include: "rules/tokenizer.smk"
    include: "rules/tokenize.smk"


include: "rules/data_manifests.smk"
include: "rules/random_init.smk"
include: "rules/calibrate.smk"
include: "rules/train.smk"
include: "rules/parse.smk"
include: "rules/traces.smk"
include: "rules/figures.smk"
include: "rules/doctor.smk"
include: "rules/bench.smk"
include: "rules/verify.smk"
include: "rules/plan.smk"


if PUBLISHED_RUNS:

    include: "rules/published.smk"


rule all:
    default_target: True
    input:
        all_outputs(),


onstart:
    forward_sigterm_to_training_jobs()


onsuccess:
    write_report()
