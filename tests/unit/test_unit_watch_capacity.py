"""A watch the kernel refuses an inotify instance: the process out of descriptors (a real
``EMFILE``, made by lowering ``RLIMIT_NOFILE`` below the descriptors already open, for the
duration of the one call) is ``OSError`` from :class:`Inotify` and ``NoCapacity`` from the
manager, with nothing left registered."""

from __future__ import annotations

import errno
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest
from twisted.internet.defer import Deferred

from sandboxd.core.watch.inotify import Inotify
from sandboxd.errors import NoCapacity
from tests.unit.test_unit_manager import World, fired

T = TypeVar("T")


@contextmanager
def no_descriptor_left() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))  # 0-2 and more are open already
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def refused(call: Callable[[], T]) -> BaseException:
    with no_descriptor_left(), pytest.raises(Exception) as caught:
        call()
    return caught.value


def test_an_inotify_instance_the_kernel_refuses_is_an_os_error() -> None:
    ino = Inotify()  # the C library is loaded before the limit is lowered
    error = refused(ino.open)
    assert isinstance(error, OSError) and error.errno == errno.EMFILE
    assert error.strerror == "Too many open files"


def test_a_watch_without_an_inotify_instance_is_no_capacity(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.start()
    try:
        sandbox = world.manager.create()
        error = refused(
            lambda: fired(
                Deferred.fromCoroutine(world.manager.watch(sandbox, (), True, lambda e: None))
            )
        )
        assert isinstance(error, NoCapacity)
        assert str(error).startswith("cannot open an inotify instance: [Errno 24]")
        assert sandbox.watches == set()
    finally:
        world.close()
