"""An exec whose sandbox ran out of memory says so: ``oom_killed`` in its final frame and a
log line naming ``SANDBOXD_MEMORY_MAX``, when the cgroup's OOM kill counter rose while the
command ran and the command failed (the manager on fakes; the real kernel's count is proven in
``tests/kernel/test_isolation_http_limits.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.logger import ILogObserver, formatEvent, globalLogPublisher
from twisted.python.failure import Failure

from sandboxd.core.exec.run import Exited
from sandboxd.http import wire
from sandboxd.isolation.base import CgroupStats
from tests.unit.test_unit_manager import World, exec_request, world

__all__ = ["world"]  # the fixture


@pytest.fixture
def capture() -> Iterator[list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(observer)


def oom_kills(world: World, kills: int) -> None:
    world.cgroups.stats_value = CgroupStats(0, 0, 0, 0, kills)


@pytest.mark.parametrize(
    ("ended", "rose", "marked"),
    [
        (ProcessTerminated(signal=9), True, True),
        (ProcessTerminated(exitCode=137), True, True),  # sh -c: its child was the one killed
        (ProcessTerminated(exitCode=1), True, True),  # a child's OOM kill made it fail
        (ProcessDone(0), True, False),  # it succeeded all the same: nothing to explain
        (ProcessTerminated(signal=9), False, False),  # killed, but not by the OOM killer
    ],
)
def test_an_exec_is_marked_oom_killed_when_the_counter_rose_meanwhile(
    world: World, capture: list[dict[str, Any]], ended: Exception, rose: bool, marked: bool
) -> None:
    sandbox = world.manager.create()
    oom_kills(world, 3)
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    oom_kills(world, 5 if rose else 3)
    run.processEnded(Failure(ended))
    assert isinstance(run.outcome, Exited) and run.outcome.oom_killed is marked
    assert ("oom_killed" in wire.final_frame(run.outcome)) is marked
    said = [formatEvent(e) for e in capture if "OOM-killed" in formatEvent(e)]
    assert bool(said) is marked
    if marked:
        assert said[0].endswith(
            "the kernel OOM-killed 2 of its processes at the sandbox's memory limit,"
            " SANDBOXD_MEMORY_MAX=512M"
        )


def test_counters_that_cannot_be_read_mark_nothing(world: World) -> None:
    sandbox = world.manager.create()
    world.cgroups.stats_error = OSError("no counters")
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    run.processEnded(Failure(ProcessTerminated(signal=9)))
    assert isinstance(run.outcome, Exited) and not run.outcome.oom_killed
    world.cgroups.stats_error = None
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    world.cgroups.stats_error = OSError("gone meanwhile")
    run.processEnded(Failure(ProcessTerminated(signal=9)))
    assert isinstance(run.outcome, Exited) and not run.outcome.oom_killed
