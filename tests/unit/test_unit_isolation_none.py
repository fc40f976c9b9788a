"""The isolation seam (``sandboxd.isolation.base``) and its development bundle (``none``)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.python.threadpool import ThreadPool

from sandboxd.isolation import none
from sandboxd.isolation.base import (
    CD_AND_EXEC,
    CgroupStats,
    Identity,
    IsolationUnavailable,
    Limits,
    NoFreeUid,
    plain_env,
)

ME = Identity(os.getuid(), os.getgid())


def test_counting_pool() -> None:
    pool = none.CountingPool(ME, 2)
    assert (pool.total, pool.free) == (2, 2)
    assert pool.allocate() == ME
    assert pool.allocate() == ME
    assert pool.free == 0
    with pytest.raises(NoFreeUid, match="all 2 sandbox slots"):
        pool.allocate()
    pool.release(ME)
    assert pool.free == 1
    pool.release(ME)
    pool.release(ME)  # never below zero used
    assert pool.free == 2


def test_no_cgroups() -> None:
    cgroups = none.NoCgroups()
    assert cgroups.name == "none"
    cgroups.preflight()
    cgroups.create("0123456789abcdef", Limits(memory_bytes=1, cpu_cores=1.0, pids=1))
    assert cgroups.join_files("0123456789abcdef") == ()
    results: list[Any] = []
    cgroups.kill("0123456789abcdef").addCallback(results.append)
    assert results == [None]
    cgroups.remove("0123456789abcdef")
    assert cgroups.stats("0123456789abcdef") == CgroupStats(0, 0, 0, 0, 0)
    assert cgroups.leftovers() == []


def test_session_wrapper_starts_a_session_and_enters_cwd_only() -> None:
    wrap = none.session_wrapper("/usr/bin/setsid")
    argv = wrap(ME, ["/sys/fs/cgroup/x/cgroup.procs"], "/ws", ["sh", "-c", "true"])
    setsid = ["/usr/bin/setsid", "--"]
    assert argv == [*setsid, "/bin/sh", "-c", CD_AND_EXEC, "sh", "/ws", "sh", "-c", "true"]


def test_find_program() -> None:
    assert os.path.basename(none.find_program("setsid")) == "setsid"
    with pytest.raises(IsolationUnavailable, match=r"^no-such-program-here not found"):
        none.find_program("no-such-program-here")


def test_plain_env_copies() -> None:
    env = {"A": "1"}
    copied = plain_env(env)
    assert copied == env and copied is not env


def test_no_isolation_bundle() -> None:
    pool = ThreadPool(0, 1)
    isolation = none.no_isolation(reactor, pool, 3, None)
    assert isolation.name == "none"
    assert not isolation.owns_files
    assert isolation.uids.total == 3
    assert isolation.uids.allocate() == ME
    assert isolation.spawn_env({"A": "1"}) == {"A": "1"}
    assert isolation.wrap(ME, (), "/ws", ["true"])[1:3] == ["--", "/bin/sh"]
    assert isolation.exec_chain == "shell"


def test_no_isolation_bundle_with_the_helper() -> None:
    isolation = none.no_isolation(reactor, ThreadPool(0, 1), 3, "/opt/sandboxd-exec")
    assert isolation.wrap(ME, (), "/ws", ["true"]) == [
        "/opt/sandboxd-exec",
        "session",
        "/ws",
        "true",
    ]
    assert isolation.exec_chain == "helper /opt/sandboxd-exec"


@pytest_twisted.ensureDeferred
async def test_threaded_files_run_in_a_worker_thread() -> None:
    pool = ThreadPool(1, 1, name="test-files")
    pool.start()
    try:
        files = none.ThreadedFiles(reactor, pool)
        name = await files.run(ME, lambda: threading.current_thread().name)
        assert name != threading.current_thread().name
    finally:
        pool.stop()
