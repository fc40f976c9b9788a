"""An inotify instance opened as a sandbox's uid is charged to that uid (docs/isolation.rst,
"Kernel quotas"), measured on the real kernel: a child process of that uid counts how many
instances it may still open (``fs.inotify.max_user_instances`` less what the uid holds), before
and while the instance is open."""

import errno
import os
from pathlib import Path

import attrs
import pytest
from twisted.internet.defer import Deferred

from sandboxd.core.watch.charge import SETRESUID, ThreadEuid, open_charged_to, thread_euid
from sandboxd.core.watch.inotify import Inotify
from sandboxd.errors import NoCapacity
from tests.support.fakes import fake_isolation
from tests.unit.test_unit_manager import World, fired
from tests.unit.test_unit_watch_capacity import refused

UID = 5000
"""The fake isolation's sandbox uid."""

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="opening as another uid needs root")


def instances_left(uid: int) -> int:
    """How many inotify instances a process of ``uid`` may open now (a child that opens
    them until refused)."""
    ino = Inotify()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, which exits at once
        count = 0
        try:
            os.setresuid(uid, uid, uid)
            while count < 250:
                ino.open()
                count += 1
        finally:
            os._exit(count)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@as_root
def test_an_instance_opened_as_a_uid_is_charged_to_that_uid() -> None:
    switch = thread_euid()
    assert switch is not None
    ino = Inotify()
    before = instances_left(UID)
    fd = open_charged_to(UID, ino.open, switch.set)
    try:
        assert instances_left(UID) == before - 1
        assert os.geteuid() == 0  # the caller's thread kept root's
    finally:
        os.close(fd)
    assert instances_left(UID) == before


def test_a_refused_switch_opens_nothing() -> None:
    opened: list[int] = []

    def refuse(uid: int) -> None:
        raise PermissionError(errno.EPERM, "refused")

    def open_instance() -> int:
        opened.append(uid)
        return 3

    uid = UID
    with pytest.raises(PermissionError):
        open_charged_to(uid, open_instance, refuse)
    assert opened == []


def test_a_switch_the_kernel_refuses_is_an_os_error() -> None:
    with pytest.raises(OSError) as caught:
        ThreadEuid(number=100_000).set(UID)  # no such system call
    assert caught.value.errno == errno.ENOSYS


def test_a_machine_without_a_known_number_has_no_switch() -> None:
    assert thread_euid("sparc64") is None
    assert isinstance(thread_euid("x86_64"), ThreadEuid)
    assert set(SETRESUID) == {"x86_64", "aarch64"}


@as_root
def test_a_manager_that_owns_files_charges_the_sandbox_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(tmp_path, isolation=attrs.evolve(fake_isolation(), owns_files=True))
    readers: set[object] = set()
    monkeypatch.setattr(world.reactor, "addReader", readers.add, raising=False)
    monkeypatch.setattr(world.reactor, "removeReader", readers.discard, raising=False)
    world.start()
    try:
        sandbox = world.manager.create()
        assert sandbox.identity.uid == UID
        before = instances_left(UID)
        watch = fired(
            Deferred.fromCoroutine(world.manager.watch(sandbox, (), True, lambda e: None))
        )
        assert instances_left(UID) == before - 1
        assert readers == {watch}
        watch.close()
        assert instances_left(UID) == before
    finally:
        world.close()


@as_root
def test_an_instance_refused_to_the_sandbox_uid_is_no_capacity(tmp_path: Path) -> None:
    world = World(tmp_path, isolation=attrs.evolve(fake_isolation(), owns_files=True))
    world.start()
    try:
        sandbox = world.manager.create()
        watching = Deferred.fromCoroutine
        error = refused(lambda: fired(watching(world.manager.watch(sandbox, (), True, print))))
        assert isinstance(error, NoCapacity), error
        assert sandbox.watches == set() and world.manager.watch_budget.instances_used == 0
    finally:
        world.close()
