# Shared helpers: config validation (schema + checks that name the key at fault), paths, run specs.
import json
import os
import sys

from snakemake_interface_executor_plugins.settings import DeploymentMethod

from workflow_scripts import columns, config_check, container_image, schema, study
from workflow_scripts.importers import study_strategies
from workflow_scripts.report import figure_registry
from workflow_scripts.report.report_hook import write_report_after_success
from workflow_scripts.training.build_ops import export_extensions_dir
from workflow_scripts.training.graceful_stop import (
    forward_from_workflow as forward_sigterm_to_training_jobs,
)
from workflow_scripts.training.layout import Layout

# every config file's substitutions, the schema and its defaults, then the strategies given as DeepSpeed JSON
# files named (importers/study_strategies.py), then the checks that need both
try:
    config_check.add_up_substitutions(
        config,
        [
            os.path.join(workflow.basedir, "config.yaml"),
            *workflow.overwrite_configfiles,
        ],
    )
    config_check.fill_defaults(
        config, os.path.join(workflow.basedir, "schemas/config.schema.yaml")
    )
    config_check.check(
        config,
        planning=config_check.planning_only(sys.argv),
        before=study_strategies.expand,
    )
except config_check.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

USING_APPTAINER = (
    DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
)
# DeepSpeed's compiled ops: every job (op builds, training ranks) inherits the directory through the environment,
# not through params, so a machine-specific path never makes Snakemake rerun a training job. Under --use-apptainer
# with `auto` each job finds it inside the image (its toolchain, HOME = the working directory): a host path would
# name the host's compiler and a directory the container cannot write.
if not USING_APPTAINER or config["torch_extensions_dir"] not in (None, "auto"):
    export_extensions_dir(config["torch_extensions_dir"], config["platform"])
R = config["results_dir"]
W = config["work_dir"]
PLATFORM = config["platform"]
RUN = f"{R}/{columns.RUN_DIR}"  # layout: ws2, dp2-pp2-tp2, ...
PROFILE = bool(config["profile"]["enabled"])
# the prepared data: one folder per data setting, shared by studies and overlays (study.data_dir); every run
# reads token blocks (rule tokenize) or image rows (rule images) from it, and the manifest copied into the results
D = study.data_dir(config)
DATA = study.data_paths(config)
# a run's raw profiler traces (config profile): study.trace_dir names the same directory in the run's spec
TRACES = study.trace_dir(config, "{model}", "{strategy}", "{layout}", "{repeat}")
try:  # the image of every job under --use-apptainer; a missing one is an error now, not at the first job
    IMAGE = container_image.settle(
        config["containers"][PLATFORM],
        PLATFORM,
        using_apptainer=USING_APPTAINER,
        image_dir=workflow.deployment_settings.apptainer_prefix
        or ".snakemake/singularity",
    )
except container_image.ImageError as exc:
    raise WorkflowError(str(exc)) from None


wildcard_constraints:
    model="[A-Za-z0-9_.-]+",
    strategy="[a-z0-9_]+",
    layout="ws[0-9]+|dp[0-9]+(-[a-z]+[0-9]+)*",
    repeat="[0-9]+",
    op="[A-Za-z]+",


RUNS = study.runs(
    config
)  # (model, strategy, layout key) -> the group's train overrides


PUBLISHED_RUNS = study.published_runs(
    config
)  # the as-published variant (config published)
AS_PUBLISHED = f"{R}/as_published"
AS_PUBLISHED_RUN = f"{AS_PUBLISHED}/{columns.RUN_DIR}"


# every random initialisation the study's runs start from (the random_init stage): {folder: recipe}
RANDOM_INITS = study.random_inits(
    config,
    [
        (m, overrides, r)
        for runs in (RUNS, PUBLISHED_RUNS)
        for (m, _, _), overrides in runs.items()
        for r in range(config["repeats"])
    ],
)


def published_run_dirs():
    return [
        AS_PUBLISHED_RUN.format(model=m, strategy=s, layout=k, repeat=r)
        for (m, s, k) in PUBLISHED_RUNS
        for r in range(config["repeats"])
    ]


def run_dirs():
    return [
        RUN.format(model=m, strategy=s, layout=k, repeat=r)
        for (m, s, k) in RUNS
        for r in range(config["repeats"])
    ]


def all_outputs():
    # what `all` makes: the tables, the findings (the report's first page) and only the figures the study has
    # data for (report/figure_registry.py), the calibration's figure, traces and claims where the study has them
    traced = [f"{R}/tables/traces.csv"] if PROFILE else []
    claims = [f"{R}/tables/claims.md"] if PUBLISHED_RUNS else []
    return (
        [
            f"{R}/tables/summary.md",
            f"{R}/{columns.RUNS_TABLE}",
            f"{R}/tables/findings.md",
        ]
        + figure_registry.study_files(config, R)
        + traced
        + claims
    )


def stage_code(*modules):
    """A report stage's own modules (dotted, under workflow_scripts) as inputs of its rule: an edit to one reruns
    that stage's tables or figures, which Snakemake's code trigger cannot see behind a shell command. Training
    rules never list code: editing a module must not rerun a run."""
    return [  # relative to the working directory, as Snakemake names every other input
        os.path.relpath(
            os.path.join(workflow.basedir, "workflow_scripts", *m.split("."))
        )
        + ".py"
        for m in modules
    ]


def op_files(used):
    """build_op's outputs for every op the (strategy, options) pairs of `used` need, each once."""
    from workflow_scripts.training.build_ops import needed_ops

    names = sorted({op for s, o in used for op in needed_ops(s, o)})
    return expand(f"{W}/ops/{{op}}.json", op=names)


def ops_for(wildcards):
    s = wildcards.strategy
    return op_files([(s, config["strategy_options"].get(s, {}))])


def study_ops(wildcards=None):
    """Every op the study's runs need."""
    options = config["strategy_options"]
    strategies = {s for (_, s, _) in [*RUNS, *PUBLISHED_RUNS]}
    return op_files([(s, options.get(s, {})) for s in strategies])


def spec_of(w, overrides, out_pattern, work_root, measured=False):
    """A run's spec (workflow_scripts.study.resolve) for the run's wildcards, written under out_pattern."""
    return study.resolve(
        config,
        w.model,
        w.strategy,
        Layout.from_key(w.layout),
        int(w.repeat),
        overrides,
        out_dir=out_pattern.format(**w),
        work_dir=f"{work_root}/{columns.RUN_DIR.format(**w)}",
        ops=ops_for(w),
        measured=measured,
    )


# the files a job reads its spec from, each named by its content: the job's param is the path, so a changed spec
# reruns the job, and the command line (and a failed job's message) names only the file
SPEC_FILES = ".snakemake/run_specs"


def spec_file(text):
    """The file holding `text` (a spec's JSON), written once, when the DAG is built (a dry run too: under
    .snakemake, nothing of the study's)."""
    import hashlib

    path = f"{SPEC_FILES}/{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    if not os.path.exists(path):
        os.makedirs(SPEC_FILES, exist_ok=True)
        with open(f"{path}.{os.getpid()}", "w") as f:
            f.write(text)
        os.replace(f"{path}.{os.getpid()}", path)
    return path


def fair_spec(wildcards):
    w = wildcards
    return spec_of(w, RUNS[(w.model, w.strategy, w.layout)], RUN, W, measured=True)


def run_spec(wildcards):
    """The run's spec file (workflow_scripts/run_spec.py): a params value, so any change reruns the run."""
    return spec_file(fair_spec(wildcards).to_json(sort_keys=True))


def random_init_of(spec):
    """The random initialisation folder a run spec loads (made by the random_init stage), if any: a job's input."""
    return spec.random_init or []


def lever_trial_of(wildcards):
    """The lever trial a run reads its `auto` levers from (measured: config auto_levers.by, levers.decided_by), if
    any: the run spec names it, so a replayed or forced decision needs none."""
    return fair_spec(wildcards).train.get("lever_trial") or []


class RunWildcards(dict):
    """A run's wildcards outside a job (model, strategy, layout, repeat), read as Snakemake's are."""

    __getattr__ = dict.__getitem__


def lever_trials(wildcards=None):
    """Every lever trial the study's runs read (measured `auto`), for the findings' lever table; none where the
    levers are decided by rule, forced or replayed."""
    first = [
        RunWildcards(model=m, strategy=s, layout=k, repeat="0") for (m, s, k) in RUNS
    ]
    return sorted({t for t in map(lever_trial_of, first) if t})


def lever_trial_plan(wildcards):
    """The lever trial's file: its candidates' run specs, the configuration's shape and where decisions are cached
    (workflow_scripts.study.lever_trial_specs)."""
    w = wildcards
    plan = study.lever_trial_specs(
        config,
        w.model,
        w.strategy,
        Layout.from_key(w.layout),
        RUNS[(w.model, w.strategy, w.layout)],
        ops_for(w),
    )
    specs = {name: spec.to_dict() for name, spec in plan["specs"].items()}
    return spec_file(json.dumps({**plan, "specs": specs}, sort_keys=True))


def published_spec(wildcards):
    """The as-published run's spec: the fair run's, with the publication's own settings for the strategy; traces
    belong to the fair rows."""
    w = wildcards
    spec = spec_of(
        w,
        PUBLISHED_RUNS[(w.model, w.strategy, w.layout)],
        AS_PUBLISHED_RUN,
        f"{W}/as_published",
    )
    return spec.replace(profile=None, trace_dir=None, variant="as_published")


def published_run_spec(wildcards):
    """The as-published run's spec file."""
    return spec_file(published_spec(wildcards).to_json(sort_keys=True))


def train_threads(wildcards):
    ranks = Layout.from_key(wildcards.layout).world_size
    return ranks if PLATFORM == "cpu" else 4 * ranks  # capped by --cores


def node_world_sizes():
    """The ranks per node of the study's layouts (the collectives the calibration measures)."""
    return sorted(
        {Layout.from_key(k).world_size // config["nodes"] for (_, _, k) in RUNS}
    )


def train_gpus(wildcards):
    return (
        0
        if PLATFORM == "cpu"
        else Layout.from_key(wildcards.layout).world_size // config["nodes"]
    )


BENCH_PARTS = {
    "levers": "levers",
    "compare": "harness_vs_trainer",
}  # --part of bench_harness -> its table
BENCH_PART_OF = {table: part for part, table in BENCH_PARTS.items()}


def bench_ops(wildcards):
    b, opts = config["bench"], config["strategy_options"]
    used = [(s, opts.get(s, {})) for s in set(b["strategies"]) | {b["lever_strategy"]}]
    return op_files(used + [study.lever_run(config, lv) for lv in b["levers"]])


def bench_config(part):
    """The config one part of the harness benchmark depends on (levers, compare, sampler): no figure/table style
    (the schema's `x-presentation` sections), and of config bench only the keys the part reads (their `x-bench`):
    editing the lever list never reruns the Trainer comparison, and the other way round.
    """
    cfg = {k: v for k, v in config.items() if k not in schema.presentation_keys()}
    cfg["bench"] = {k: config["bench"][k] for k in schema.bench_keys(part)}
    return cfg


def plan_config(*extra):
    """The config sections the plan and scale rules read (rules/plan.smk: the schema's `x-plan` keys and `extra`),
    as JSON."""
    keys = schema.plan_keys() + extra
    return json.dumps({k: config[k] for k in keys if k in config}, sort_keys=True)


def write_report():
    write_report_after_success(
        workflow, config, f"{R}/report.html", needs=f"{R}/tables/summary.md"
    )


def committed_files(wildcards):
    """The committed set's run table, calibration, data manifest and each run's spec, summary and provenance."""
    against = config["verify"]["against"]
    if not against:
        return []
    import glob

    found = [
        f"{against}/{columns.RUNS_TABLE}",
        f"{against}/{columns.CALIBRATION}",
        f"{against}/{columns.TOKENS_MANIFEST}",
        f"{against}/{columns.RUN_TO_RUN}",
    ]
    pattern = columns.RUN_DIR.format(model="*", strategy="*", layout="*", repeat="*")
    for name in (columns.RUN_SPEC, columns.SUMMARY, columns.PROVENANCE):
        found += glob.glob(f"{against}/{pattern}/{name}")
    return sorted(p for p in found if os.path.exists(p))


def verified(wildcards):
    """Target verify's table, in a study that verifies (config verify.against) once verify has written it: the
    findings then give its verdict (report_hook brings them up to date after a run of target verify). A study
    without verify.against never asks for it, so `all` never reruns the comparison."""
    table = rules.compare_with_committed.output.csv
    return [table] if config["verify"]["against"] and os.path.exists(table) else []


def plan_calibration(wildcards):
    """The calibration file plan.calibration names (a GPU kind's rate file, or a path), or none."""
    from workflow_scripts.plan.step_time import rates_file

    name = config["plan"].get("calibration")
    return str(rates_file(name)) if name else []
