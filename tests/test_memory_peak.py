"""The peak diagnostic (measure/memory_peak.py): replaying an allocator trace finds the peak, the step it fell in
and what was alive there, counting frees of blocks allocated before recording began."""
from __future__ import annotations

from workflow_scripts.measure.memory_peak import frame_group, replay


def frames(path: str, name: str) -> list[dict]:
    return [{"filename": f"/venv/lib/python3.11/site-packages/{path}", "name": name, "line": 1}]


def test_replay_finds_the_peak_and_whats_alive_there():
    trace = [
        {"action": "free_requested", "addr": 99, "size": 40},  # a block from before recording (e.g. DDP buckets)
        {"action": "alloc", "addr": 1, "size": 100, "frames": frames("torch/optim/adamw.py", "_init_group")},
        {"action": "alloc", "addr": 2, "size": 50, "frames": frames("transformers/activations.py", "forward")},
        {"action": "free_requested", "addr": 2, "size": 50},
        {"action": "alloc", "addr": 3, "size": 70, "frames": frames("workflow_scripts/training/loop.py", "train")},
        {"action": "free_requested", "addr": 1, "size": 100},
    ]
    out = replay(trace, baseline=60, step_marks=[3, 6])
    assert out["recorded_peak_bytes"] == 60 - 40 + 100 + 70  # the early free is subtracted
    assert out["peak_step"] == 2 and out["peak_event"] == "workflow_scripts/training/loop.py:train"
    alive = {a["group"]: a["bytes"] for a in out["alive"]}
    assert alive == {"before step 1": 20, "torch/optim/adamw.py:_init_group": 100,
                     "workflow_scripts/training/loop.py:train": 70}


def test_frames_are_grouped_by_the_innermost_code_we_can_name():
    stack = [{"filename": "/usr/lib/python3.11/contextlib.py", "name": "__exit__"}]
    stack += frames("torch/optim/adam.py", "step")
    assert frame_group(stack) == "torch/optim/adam.py:step"
    assert frame_group([]) == "(no Python frame)"


def test_the_diagnostic_refuses_what_it_would_crash(monkeypatch):
    """PIPELINE_MEMORY_PEAK with compiled, checkpointed blocks is refused by name before any rank starts (it
    crashed torch there); eager or uncheckpointed runs, CPU runs and runs without it are not."""
    from workflow_scripts.measure.memory_peak import refused

    spec = {"platform": "cuda", "train": {"gradient_checkpointing": True, "compile_blocks": True}}
    assert refused(spec) is None
    monkeypatch.setenv("PIPELINE_MEMORY_PEAK", "4")
    assert refused(spec).startswith("PIPELINE_MEMORY_PEAK: ") and "train.compile_blocks: false" in refused(spec)
    assert refused({**spec, "train": {"gradient_checkpointing": True, "compile_blocks": False}}) is None
    assert refused({**spec, "platform": "cpu"}) is None


def test_the_recorded_steps_are_left_out_of_the_timing_and_the_switch_is_in_provenance(monkeypatch, tmp_path):
    """PIPELINE_MEMORY_PEAK=3 on a resumed run (its first step 0-based 10): steps 10, 11 and 12 record allocator
    history (a device synchronisation each), so they are `profiled` rows, which the timing leaves out; rank 1
    records nothing; the variable is in the run's provenance."""
    from types import SimpleNamespace

    from workflow_scripts.measure import metrics, provenance
    from workflow_scripts.measure.memory_peak import ENV, MemoryPeak

    monkeypatch.setenv(ENV, "3")
    peak = MemoryPeak(SimpleNamespace(device=SimpleNamespace(type="cuda", index=0), rank=0), tmp_path)
    assert [s for s in range(8, 16) if peak.recording(s, 10)] == [10, 11, 12]
    other = MemoryPeak(SimpleNamespace(device=SimpleNamespace(type="cuda", index=0), rank=1), tmp_path)
    assert not any(other.recording(s, 10) for s in range(8, 16))
    rows = [{"step": s + 1, "warmup": False, "profiled": peak.recording(s, 10)} for s in range(10, 16)]
    assert [r["step"] for r in metrics.steady(rows)] == [14, 15, 16]
    assert provenance.collect({"run_id": "r"}, 0.0, 1.0, measured={})["env"][ENV] == "3"
