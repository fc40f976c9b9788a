"""The idle reaper and the drain deadline, driven by a ``Clock`` (no waiting on real time)."""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock

from sandboxd.boot import reap_interval
from sandboxd.config import Config
from sandboxd.core.layout import Layout
from sandboxd.core.manager import SandboxManager
from sandboxd.isolation.none import NoCgroups, no_isolation
from tests.http.http_harness import ProcessReactor, SyncFiles, SyncPool, result_of


class FakeRun:
    """Stands in for a running command: the manager only asks it to abort."""

    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[SandboxManager]:
    config = Config.load(
        {},
        {
            "isolation": "none",
            "root": str(tmp_path / "root"),
            "idle-ttl": "30m",
            "drain-deadline": "60s",
            "drain-idle": "10s",
            "uid-min": "1000",
            "uid-max": "1003",
        },
    )
    reactor = ProcessReactor()
    isolation = attrs.evolve(no_isolation(reactor, None, 4, None), fs=SyncFiles())  # type: ignore[arg-type]
    layout = Layout(config.root, owns_files=False)
    layout.prepare_root()
    built = SandboxManager(config, reactor, Clock(), isolation, SyncPool(), layout)  # type: ignore[arg-type]
    result_of(built.start())
    yield built
    os.close(built._devnull)


def metric(manager: SandboxManager, name: str) -> float:
    for family in text_string_to_metric_families(manager.metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise KeyError(name)


def test_reaper_kills_only_sandboxes_idle_past_the_ttl(manager: SandboxManager) -> None:
    clock: Any = manager.clock
    old = manager.create()
    clock.advance(20 * 60)
    fresh = manager.create()
    clock.advance(10 * 60)  # old: 30 min idle, fresh: 10 min
    result_of(manager.reap_idle())
    assert set(manager.sandboxes) == {fresh.rid}
    assert not os.path.exists(manager.layout.directory(old.rid))
    assert metric(manager, "sandboxd_sandboxes_reaped_total") == 1
    assert metric(manager, "sandboxd_uid_pool_free") == 3


def test_a_call_or_a_running_command_keeps_a_sandbox_alive(manager: SandboxManager) -> None:
    clock: Any = manager.clock
    called = manager.create()
    busy = manager.create()
    busy.running.add(FakeRun())  # type: ignore[arg-type]
    clock.advance(29 * 60)
    manager.get(called.rid)  # any API call is activity
    clock.advance(2 * 60)
    result_of(manager.reap_idle())
    assert set(manager.sandboxes) == {called.rid, busy.rid}


def test_reaper_survives_a_failing_kill(manager: SandboxManager) -> None:
    clock: Any = manager.clock
    calls: list[str] = []

    class Refusing(NoCgroups):
        def kill(self, rid: str) -> Any:
            calls.append(rid)
            if rid == first.rid:
                raise OSError("the kernel said no")
            return super().kill(rid)

    manager.isolation = attrs.evolve(manager.isolation, cgroups=Refusing())
    first, second = manager.create(), manager.create()  # each holds the isolation it was made by
    clock.advance(31 * 60)
    result_of(manager.reap_idle())
    assert sorted(calls) == sorted([first.rid, second.rid])
    assert second.rid not in manager.sandboxes


def test_drain_waits_for_running_commands_until_the_deadline(manager: SandboxManager) -> None:
    clock: Any = manager.clock
    sandbox = manager.create()
    run = FakeRun()
    sandbox.running.add(run)  # type: ignore[arg-type]
    drained = manager.drain()
    assert manager.draining
    clock.advance(30)
    assert not drained.called and not run.aborted  # still waiting for the command
    clock.advance(31)  # past the 60 s deadline
    assert drained.called and run.aborted
    assert manager.sandboxes == {}
    assert result_of(manager.drain()) is None  # a second drain is already done


def test_drain_ends_once_commands_end_and_the_grace_passes(manager: SandboxManager) -> None:
    clock: Any = manager.clock
    sandbox = manager.create()
    run = FakeRun()
    sandbox.running.add(run)  # type: ignore[arg-type]
    drained = manager.drain()
    also = manager.drain()
    clock.advance(1)
    sandbox.running.clear()
    sandbox.last_active = clock.seconds()  # the command's end is activity
    clock.pump([manager.drain_poll] * 95)
    assert not drained.called  # 9.5 s between two commands of a turn: kept
    clock.pump([manager.drain_poll] * 10)
    assert drained.called and also.called and not run.aborted
    assert metric(manager, "sandboxd_draining") == 1
    assert metric(manager, "sandboxd_drain_kills_total") == 1


def test_a_sandbox_in_use_during_a_drain_stays_and_an_idle_one_goes(
    manager: SandboxManager,
) -> None:
    clock: Any = manager.clock
    used, _idle = manager.create(), manager.create()
    drained = manager.drain()
    assert metric(manager, "sandboxd_drain_waiting") == 2
    for _ in range(20):  # a call every 2 s for 40 s
        clock.pump([manager.drain_poll] * 20)
        manager.get(used.rid)
        if clock.seconds() > 11:
            assert set(manager.sandboxes) == {used.rid}
    assert not drained.called
    clock.pump([manager.drain_poll] * 110)  # 11 s with no call: the grace passed
    assert drained.called and manager.sandboxes == {}
    assert metric(manager, "sandboxd_drain_kills_total") == 2


def test_the_deadline_cuts_a_sandbox_used_throughout(manager: SandboxManager) -> None:
    clock: Any = manager.clock
    used = manager.create()
    drained = manager.drain()
    while not drained.called:
        clock.advance(1)
        if used.rid in manager.sandboxes:
            manager.get(used.rid)
    assert clock.seconds() == pytest.approx(60, abs=1)
    assert metric_labelled(manager, "sandboxd_drain_kills_total", "deadline") == 1


def test_stop_now_ends_the_wait_at_once(manager: SandboxManager) -> None:
    clock: Any = manager.clock
    sandbox = manager.create()
    run = FakeRun()
    sandbox.running.add(run)  # type: ignore[arg-type]
    drained = manager.drain()
    clock.advance(1)
    assert not drained.called
    manager.stop_now()
    clock.advance(manager.drain_poll)
    assert drained.called and run.aborted
    assert metric_labelled(manager, "sandboxd_drain_kills_total", "forced") == 1


def metric_labelled(manager: SandboxManager, name: str, reason: str) -> float:
    for family in text_string_to_metric_families(manager.metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("reason") == reason:
                return float(sample.value)
    raise KeyError(name)


def test_reap_interval_is_bounded() -> None:
    assert reap_interval(30 * 60) == 60
    assert reap_interval(8) == 2
    assert reap_interval(1) == 1
