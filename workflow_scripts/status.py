"""Every status and verdict a row or a file can carry, in one place, as str-valued enums: a member is its string
(`RunStatus.OK == "ok"`, JSON and CSV write "ok"), so tables and files read the same as plain strings."""
from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A run's `status` in summary.json and tables/runs.csv."""

    OK = "ok"  # trained and measured
    OOM = "oom"  # out of device memory (the run, or predicted before it started with plan.refuse_oom)
    UNSUPPORTED = "unsupported"  # the strategy / layout cannot run this configuration here (the row says why)
    FAILED = "failed"  # anything else that ended without a summary


class Verdict(StrEnum):
    """A verification rerun's verdict per run (report/verify.py)."""

    REPRODUCED = "reproduced"
    DIFFERS_EXPLAINED = "differs-explained"
    DIFFERS_UNEXPLAINED = "differs-unexplained"
    SETTINGS_CHANGED = "settings-changed"
    STATUS_CHANGED = "status-changed"
    MISSING = "missing"


PASSING = (Verdict.REPRODUCED, Verdict.DIFFERS_EXPLAINED)  # the verdicts a verification passes with
