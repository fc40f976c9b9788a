"""The daemon's budget of inotify instances and watches under its own uid (docs/isolation.rst,
"Kernel quotas"): its arithmetic, and real watches on a temporary tree taking from it and
giving back (the file work runs in the test's own thread)."""

import os
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from sandboxd.core.watch.budget import (
    UNKNOWN_INSTANCES,
    UNKNOWN_WATCHES,
    WatchBudget,
    host_budget,
    kernel_limit,
)
from sandboxd.core.watch.watch import WatchEvent
from sandboxd.errors import InsufficientStorage, NoCapacity
from tests.unit.test_unit_manager import World, fired
from tests.unit.test_unit_watch import started


def test_the_budget_keeps_a_reserve_and_shares_it_out() -> None:
    budget = WatchBudget.of_limits(128, 8192)
    assert (budget.instances, budget.watches, budget.per_sandbox) == (96, 6144, 1536)
    assert WatchBudget.of_limits(1, 2).per_sandbox == 1


def test_the_kernel_limits_are_read_or_assumed(tmp_path: Path) -> None:
    (tmp_path / "max_user_watches").write_text("500\n")
    (tmp_path / "max_user_instances").write_text("lots\n")
    assert kernel_limit("max_user_watches", 7, tmp_path) == 500
    assert kernel_limit("max_user_instances", 7, tmp_path) == 7
    assert kernel_limit("missing", 7, tmp_path) == 7
    assumed = host_budget(lambda name, unknown: unknown)
    assert assumed == WatchBudget.of_limits(UNKNOWN_INSTANCES, UNKNOWN_WATCHES)
    assert host_budget().instances > 0


def test_watches_are_taken_within_the_total_and_each_sandbox_share() -> None:
    budget = WatchBudget(instances=2, watches=10, per_sandbox=6)
    first, second = budget.account("a"), budget.account("b")
    assert first is not None and second is not None
    assert budget.account("c") is None  # every instance held
    assert first.take(8) == 6  # its share
    assert first.take(1) == 0
    assert second.take(8) == 4  # what the total has left
    assert (budget.watches_used, budget.by_sandbox) == (10, {"a": 6, "b": 4})
    first.give(2)
    assert (first.held, budget.by_sandbox["a"]) == (4, 4)
    first.close()
    first.close()  # once
    assert (budget.watches_used, budget.by_sandbox, budget.instances_used) == (4, {"b": 4}, 1)
    assert budget.account("c") is not None


def watch_with(tmp_path: Path, budget: WatchBudget) -> Any:
    account = budget.account("rid")
    assert account is not None
    watch, _, events, done, _ = started(tmp_path, account=account)
    return watch, events, done


def test_a_tree_past_the_budget_is_refused_and_gives_all_back(tmp_path: Path) -> None:
    for name in "abcd":
        (tmp_path / name).mkdir()
    budget = WatchBudget(instances=1, watches=3, per_sandbox=3)
    watch, _, done = watch_with(tmp_path, budget)
    assert isinstance(done[0], Failure) and done[0].check(InsufficientStorage)
    assert watch.closed
    assert (budget.watches_used, budget.instances_used, budget.by_sandbox) == (0, 0, {})


def test_followed_directories_take_from_the_budget_and_give_back(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    budget = WatchBudget(instances=1, watches=3, per_sandbox=3)
    watch, events, done = watch_with(tmp_path, budget)
    assert done == [None]
    assert budget.watches_used == 2  # the tree and a: the room left over was given back
    (tmp_path / "b").mkdir()
    watch.doRead()
    assert budget.watches_used == 3 and len(watch.paths) == 3
    (tmp_path / "c").mkdir()
    watch.doRead()  # no room left: c is not followed
    assert events[-1] == WatchEvent("overflow") and len(watch.paths) == 3
    os.rmdir(tmp_path / "b")
    watch.doRead()
    assert budget.watches_used == 2 and len(watch.paths) == 2
    watch.close()
    assert (budget.watches_used, budget.instances_used) == (0, 0)


def test_a_manager_without_an_instance_left_is_no_capacity(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.start()
    try:
        world.manager.watch_budget = WatchBudget(instances=0, watches=10, per_sandbox=10)
        sandbox = world.manager.create()
        with pytest.raises(NoCapacity, match="every inotify instance"):
            fired(Deferred.fromCoroutine(world.manager.watch(sandbox, (), True, print)))
        assert sandbox.watches == set()
    finally:
        world.close()
