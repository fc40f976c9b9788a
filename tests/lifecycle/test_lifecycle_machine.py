"""Run the lifecycle state machine against each daemon variant (issue 7, "Lifecycle").

``SANDBOXD_LIFECYCLE_EXAMPLES`` and ``SANDBOXD_LIFECYCLE_STEPS`` scale the run (defaults keep
each variant well under a minute).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from twisted.internet.defer import Deferred

from tests.lifecycle.lifecycle_harness import InProcessDaemon, synchronously
from tests.lifecycle.lifecycle_machine import LifecycleMachine

EXAMPLES = int(os.environ.get("SANDBOXD_LIFECYCLE_EXAMPLES", "20"))
STEPS = int(os.environ.get("SANDBOXD_LIFECYCLE_STEPS", "30"))

SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def run_machine(name: str, factory: Callable[[], InProcessDaemon], kernel: bool) -> None:
    counters: dict[str, int] = {}
    machine = type(
        name,
        (LifecycleMachine,),
        {"make_daemon": staticmethod(factory), "kernel": kernel, "tally": counters},
    )
    started = time.monotonic()
    run_state_machine_as_test(machine, settings=SETTINGS)
    calls = ", ".join(f"{k}={v}" for k, v in sorted(counters.items()))
    print(
        f"\nlifecycle {name}: {counters.get('examples', 0)} examples,"
        f" {sum(v for k, v in counters.items() if k != 'examples')} rule calls"
        f" in {time.monotonic() - started:.1f} s ({calls})"
    )


def test_lifecycle_without_isolation(
    none_daemon: Callable[[], InProcessDaemon],
) -> Deferred[None]:
    return synchronously(lambda: run_machine("none", none_daemon, kernel=False))


@pytest.mark.kernel
def test_lifecycle_with_real_uids_and_cgroups(
    kernel_daemon: Callable[[], InProcessDaemon],
) -> Deferred[None]:
    return synchronously(lambda: run_machine("cgroup1", kernel_daemon, kernel=True))
