"""The daemon variants the lifecycle tests run against (``twistd sandboxd`` options)."""

from __future__ import annotations

import os

from sandboxd.isolation.select import Host

NONE_SETTINGS = {"isolation": "none", "uid-min": "1000", "uid-max": "1002"}
"""Three sandbox slots: creates beyond them must answer ``503 NoCapacity``."""

_UID_BASE = 236_000 + (os.getpid() % 1000) * 3
"""Runs of this suite at the same time (developers, CI) get uid ranges of their own."""

KERNEL_SETTINGS = {
    "isolation": "cgroup1",
    "uid-min": str(_UID_BASE),
    "uid-max": str(_UID_BASE + 2),
    "memory-max": "256M",
    "cpu-cores": "1",
    "pids-max": "64",
}
"""Real uids (a range no other test uses) and real cgroup v1 limits; three sandboxes."""

KERNEL_HOST = Host(set_oom_score_adj=lambda value: None)
"""The real host, except that the test runner keeps its own ``oom_score_adj`` (protecting
itself from the OOM killer is the daemon's business, not the test process's)."""
