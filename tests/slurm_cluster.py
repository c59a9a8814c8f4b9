"""A real single-node SLURM cluster for tests, from Debian's `slurm-wlm` and `munge` (run as root).

    slurm_cluster   the fixture: a started cluster, for the whole session (tests/conftest.py loads this module as
                    a plugin)
    slurm_study     the reduced study of tests/test_slurm.py submitted to it through profiles/slurm, started with
                    the session where a collected test needs it: its jobs mostly wait (queueing, status polls,
                    each job's own Snakemake start; two cores 40 % busy over its 2 min 10 s alone), so it runs
                    beside the first tests, and its tests take its result where they come

Everything lives in one temporary directory: a generated slurm.conf (this machine's CPUs and a bit less than its
memory, partition `debug`, no accounting, proctrack/linuxproc, task/none, cons_tres, MinJobAge=7200 so `squeue`
still shows the study's finished jobs when its tests come, late in the session), a fresh munge key, free TCP ports,
state and spool directories and the daemons' logs.
`munged` runs as the `munge` user (as root with --force where that user does not exist), then `slurmctld` and
`slurmd` in the foreground, as children of the test process; teardown cancels this cluster's jobs and stops the
three daemons by their process ids.

Clients find the cluster through SLURM_CONF, and also through /etc/slurm/slurm.conf, a symlink to the generated
file made only while the test runs and only where no slurm.conf exists: the SLURM executor plugin's jobstep
(snakemake-executor-plugin-slurm-jobstep 0.6.1) drops every SLURM_* variable except the job's identity before its
`srun`, SLURM_CONF included, so inside a job srun only finds the default path (else: "srun: fatal: Could not
establish a configuration source"). A machine with its own /etc/slurm/slurm.conf is never touched: the tests skip.
"""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import REPO, copy_workflow, snakemake_command

SYSTEM_CONF = Path("/etc/slurm/slurm.conf")  # the compiled-in default path of Debian's slurm-wlm
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel", "srun")


def missing_binaries() -> list[str]:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [b for b in BINARIES if shutil.which(b, path=search) is None]


def _which(name: str) -> str:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


# ------------------------------------------------------------------ the reduced study its tests submit
PROFILE = REPO / "profiles/slurm/config.yaml"
STRATEGIES = ["ddp", "fsdp"]  # no DeepSpeed: no op builds, the test stays short
REDUCED = {
    "study": "slurm_reduced",
    "results_dir": "results/reduced",
    "work_dir": "work/reduced",
    "strategies": STRATEGIES,
    "corpus": {"source": "stdlib", "max_bytes": 300_000},
    "tokenizer": {"kind": "bpe", "vocab_size": 512},
    "data": {"block_size": 64},
    "train": {"max_steps": 4, "log_every": 2, "timing_warmup_steps": 1, "eval_batches": 1, "checkpoint_every": 0},
}


def reduced_study(wd):
    (wd / "reduced.yaml").write_text(yaml.safe_dump(REDUCED))
    return ["--configfile", "config.yaml", "reduced.yaml"]


def cluster_overlay(cluster) -> dict:
    """Only what a one-node, two-CPU test cluster needs on top of profiles/slurm (a second --profile replaces
    whole top-level keys): its partition, memory and time that fit the node, threads capped at its CPUs, fast
    status polling. Every other key, the train resources included, is the profile's."""
    profile = yaml.safe_load(PROFILE.read_text())
    fit = {"runtime": 10, "mem_mb": min(4000, cluster.memory_mb // 2)}
    return {
        "default-resources": {**profile["default-resources"], "slurm_partition": cluster.partition,
                              "runtime": 10, "mem_mb": 1000},
        "set-resources": {rule: {**res, **fit} for rule, res in profile["set-resources"].items()},
        "slurm-init-seconds-before-status-checks": 1,
        "seconds-between-status-checks": 1,
        "slurm-keep-successful-logs": True,
        "latency-wait": 5,
        "max-threads": cluster.cpus,
    }


@dataclass
class SlurmCluster:
    root: Path
    partition: str = "debug"
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    cpus: int = field(default_factory=_cpus)
    memory_mb: int = field(default_factory=lambda: int(_memory_mb() * 0.9))  # a bit under the real memory
    procs: dict = field(default_factory=dict)
    linked: bool = False

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict:
        return {"SLURM_CONF": str(self.conf)}

    def log(self, daemon: str) -> str:
        path = self.root / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------------ setup
    def write_config(self) -> None:
        for d in ("state", "spool", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "plugstack.conf").write_text("")  # not the machine's /etc/slurm/plugstack.conf
        ctld_port, slurmd_port = _free_port(), _free_port()
        self.conf.write_text("\n".join([
            "# generated by tests/slurm_cluster.py: a single-node test cluster",
            "ClusterName=pipeline-test",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.root / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'slurmd.log'}",
            f"PlugStackConfig={self.root / 'plugstack.conf'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MinJobAge=7200",
            "ReturnToService=2",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "KillWait=5",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def start_munge(self) -> None:
        mdir = self.root / "munge"
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        cmd = [_which("munged"), "--foreground", f"--socket={mdir / 'munge.socket'}", f"--key-file={key}",
               f"--pid-file={mdir / 'munged.pid'}", f"--log-file={mdir / 'munged.log'}",
               f"--seed-file={mdir / 'munged.seed'}"]
        try:
            user = pwd.getpwnam("munge")
        except KeyError:
            user = None
        if user is not None:  # the usual way: munged as the munge user, owning its key and directory
            for p in (mdir, key):
                os.chown(p, user.pw_uid, user.pw_gid)
            mdir.chmod(0o755)

            def drop():
                os.setgid(user.pw_gid)
                os.setgroups([])
                os.setuid(user.pw_uid)
            preexec = drop
        else:
            cmd.append("--force")
            preexec = None
        self.procs["munged"] = subprocess.Popen(cmd, preexec_fn=preexec, stdout=subprocess.DEVNULL,
                                                stderr=open(mdir / "munged.stderr", "w"))
        self._wait(lambda: (mdir / "munge.socket").exists(), 20, "munged did not create its socket",
                   lambda: (mdir / "munged.stderr").read_text() + (mdir / "munged.log").read_text()
                   if (mdir / "munged.log").exists() else "")

    def start_slurm(self) -> None:
        env = {**os.environ, **self.env}
        for daemon in ("slurmctld", "slurmd"):
            node = ["-N", self.node] if daemon == "slurmd" else []
            self.procs[daemon] = subprocess.Popen([_which(daemon), "-D", "-f", str(self.conf), *node], env=env,
                                                  stdout=subprocess.DEVNULL,
                                                  stderr=open(self.root / f"{daemon}.stderr", "w"))
            if daemon == "slurmctld":
                self._wait(lambda: self._run(["scontrol", "ping"]).returncode == 0, 60,
                           "slurmctld does not answer", lambda: self.log("slurmctld"))
        self._wait(lambda: self.node_state() == "idle", 90, "the node never became idle",
                   lambda: self.log("slurmctld")[-3000:] + self.log("slurmd")[-3000:])

    def link_system_conf(self) -> None:
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.symlink_to(self.conf)
        self.linked = True

    def start(self) -> SlurmCluster:
        self.write_config()
        self.link_system_conf()
        self.start_munge()
        self.start_slurm()
        return self

    # ------------------------------------------------------------------ queries
    def _run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run([_which(cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **self.env}, **kw)

    def node_state(self) -> str:
        done = self._run(["sinfo", "-h", "-N", "-o", "%t"])
        return done.stdout.strip() if done.returncode == 0 else ""

    def job_ids(self) -> list[str]:
        """Every job slurmctld still knows (MinJobAge=7200 keeps finished ones for two hours)."""
        done = self._run(["squeue", "-h", "-t", "all", "-o", "%i"])
        return done.stdout.split()

    def show_job(self, job_id: str) -> dict:
        done = self._run(["scontrol", "-o", "show", "job", str(job_id)])
        if done.returncode != 0:
            return {}
        fields = {}
        for token in done.stdout.split():
            if "=" in token:
                k, v = token.split("=", 1)
                fields[k] = v
        return fields

    def sbatch(self, *args: str) -> str:
        done = self._run(["sbatch", "--parsable", *args], check=True)
        return done.stdout.strip().split(";")[0]

    @staticmethod
    def _wait(ok, timeout: float, what: str, details=lambda: "") -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if ok():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{what} within {timeout:.0f} s:\n{details()}")

    # ------------------------------------------------------------------ teardown
    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            ids = [i for i in self.job_ids()
                   if self.show_job(i).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]
            if ids:
                self._run(["scancel", *ids])
                deadline = time.time() + 30
                while time.time() < deadline and any(
                        self.show_job(i).get("JobState") in ("RUNNING", "COMPLETING") for i in ids):
                    time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        if self.linked and SYSTEM_CONF.is_symlink() and os.readlink(SYSTEM_CONF) == str(self.conf):
            SYSTEM_CONF.unlink()
            self.linked = False


def _controller_alive() -> bool:
    """Whether the slurmctld of the test cluster that SYSTEM_CONF links to still runs (its pid file, its process).
    A dead one's link slows every SLURM client: `scontrol` retries an unreachable controller for 9 s."""
    pid_file = Path(os.readlink(SYSTEM_CONF)).parent / "slurmctld.pid"
    try:
        return "slurmctld" in Path(f"/proc/{int(pid_file.read_text())}/cmdline").read_text(errors="replace")
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="session")
def slurm_cluster():
    """A started single-node cluster, torn down at the session's end (so the daemons and the /etc/slurm/slurm.conf
    link never outlive the tests). Its clients get SLURM_CONF from `cluster.env`, passed to each command, so no
    other test's process sees it."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"SLURM/munge binaries missing ({', '.join(missing)}): apt-get install slurm-wlm munge "
                    "(.ci/run installs them)")
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons (slurmctld, slurmd, munged) must be started as root")
    if SYSTEM_CONF.is_symlink() and "pipeline-slurm-" in os.readlink(SYSTEM_CONF) and not _controller_alive():
        SYSTEM_CONF.unlink()  # left by an earlier test session that was killed: it was ours, its daemons are gone
    if SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
        pytest.skip(f"{SYSTEM_CONF} exists (a configured SLURM machine, or another test cluster running): the "
                    "test cluster needs that path for srun inside jobs and never replaces it")
    root = Path(tempfile.mkdtemp(prefix="pipeline-slurm-"))
    root.chmod(0o755)  # munged (as the munge user) must reach its directory inside
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


class BackgroundStudy:
    """A Snakemake run started and not waited for; `result()` waits for its end and fails with its log's tail."""

    def __init__(self, wd: Path, args: list[str], env: dict, timeout: float):
        cmd, full_env = snakemake_command(*args, env=env, report=True)
        self.wd, self.timeout, self.log_path = wd, timeout, wd.parent / "snakemake.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=wd, env=full_env, stdout=log, stderr=subprocess.STDOUT)

    def result(self) -> tuple[Path, str]:
        code = self.proc.wait(timeout=self.timeout)
        log = self.log_path.read_text(errors="replace")
        if code != 0:
            raise AssertionError(f"the SLURM study failed ({code}):\n{log[-6000:]}")
        return self.wd, log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def slurm_study(slurm_cluster, tmp_path_factory):
    """The reduced study submitted through profiles/slurm and a test overlay (cluster_overlay), running."""
    wd = copy_workflow(tmp_path_factory.mktemp("slurm") / "wf")
    overlay = wd / "slurm-test-profile"
    overlay.mkdir()
    (overlay / "config.yaml").write_text(yaml.safe_dump(cluster_overlay(slurm_cluster)))
    study = BackgroundStudy(wd, ["--profile", "profiles/slurm", "--profile", str(overlay), *reduced_study(wd)],
                            env=slurm_cluster.env, timeout=1200)
    yield study
    study.stop()  # a session cut short: Snakemake cancels its jobs before the cluster stops


@pytest.fixture(scope="session", autouse=True)
def slurm_study_with_the_session(request):
    """Starts slurm_study before the first test where a collected test needs it; without SLURM here each of those
    tests says so itself."""
    if any("slurm_study" in item.fixturenames for item in request.session.items):
        try:
            request.getfixturevalue("slurm_study")
        except pytest.skip.Exception:
            pass
