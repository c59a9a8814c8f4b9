# Shared helpers: config validation (schema + checks that name the key at fault), paths, run specs.
import json

from snakemake.utils import validate

from workflow_scripts import config_check, study
from workflow_scripts.report_hook import write_report_after_success


validate(config, schema="../schemas/config.schema.yaml", set_default=True)
try:
    config_check.check(config)
except config_check.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

R = config["results_dir"]
W = config["work_dir"]
PLATFORM = config["platform"]
RUN = f"{R}/runs/{{model}}/{{strategy}}/ws{{world}}/r{{repeat}}"
IMAGE = config["containers"][PLATFORM]  # used only under --use-apptainer
FIGURES = ["loss_curves", "peak_memory", "throughput", "time_per_epoch", "mfu", "memory_timeline",
           "memory_vs_throughput", "scaling"]


wildcard_constraints:
    model="[A-Za-z0-9_.-]+",
    strategy="[a-z0-9_]+",
    world="[0-9]+",
    repeat="[0-9]+",
    op="[A-Za-z]+",


RUNS = study.runs(config)  # (model, strategy, world_size) -> the group's train overrides


def run_dirs():
    return [RUN.format(model=m, strategy=s, world=w, repeat=r) for (m, s, w) in RUNS
            for r in range(config["repeats"])]


def all_outputs():
    return [f"{R}/tables/summary.md", f"{R}/tables/runs.csv"] + expand(
        f"{R}/figures/{{name}}.{{ext}}", name=FIGURES, ext=["png", "pdf"])


def ops_for(wildcards):
    from workflow_scripts.build_ops import needed_ops

    return expand(f"{W}/ops/{{op}}.json", op=needed_ops(wildcards.strategy, PLATFORM))


def run_spec(wildcards):
    """Everything one training run depends on (and nothing else: editing figures never reruns training)."""
    out = RUN.format(**wildcards)
    spec = {
        "run_id": f"{wildcards.model}__{wildcards.strategy}__ws{wildcards.world}__r{wildcards.repeat}",
        "study": config["study"],
        "model": wildcards.model,
        "strategy": wildcards.strategy,
        "world_size": int(wildcards.world),
        "repeat": int(wildcards.repeat),
        "nodes": config["nodes"],
        "platform": PLATFORM,
        "precision": config["train"]["precision"],
        "train": {k: v for k, v in config["train"].items() if k != "precision"}
        | RUNS[(wildcards.model, wildcards.strategy, int(wildcards.world))],
        "options": config["strategy_options"].get(wildcards.strategy, {}),
        "pretrained": config["pretrained"].get(wildcards.model),
        "model_overrides": config["model_overrides"].get(wildcards.model, {}),
        "sampler": config["sampler"],
        "substitutions": config["substitutions"],
        "data": {"train": f"{W}/data/train.npy", "val": f"{W}/data/val.npy",
                 "manifest": f"{R}/data/tokens_manifest.json"},
        "ops": ops_for(wildcards),
        "torch_extensions_dir": f"{W}/torch_extensions",
        "out_dir": out,
        "work_dir": f"{W}/runs/{wildcards.model}/{wildcards.strategy}/ws{wildcards.world}/r{wildcards.repeat}",
    }
    # a different repeat trains with a different seed, so repeats measure variance, not the same run twice
    spec["train"]["seed"] = config["train"]["seed"] + int(wildcards.repeat)
    return json.dumps(spec, sort_keys=True)


def train_threads(wildcards):
    return int(wildcards.world) if PLATFORM == "cpu" else 4 * int(wildcards.world)  # capped by --cores


def train_gpus(wildcards):
    return 0 if PLATFORM == "cpu" else int(wildcards.world) // config["nodes"]


def write_report():
    write_report_after_success(workflow, config, f"{R}/report.html")
