"""Spawning rsync for the archive (``sandboxd.core.archive.rsync``) on a recording reactor: the
workspace ends refused before anything runs, a spawn that fails, and what an rsync's exit and
output become."""

from __future__ import annotations

import os
from typing import cast

import pytest
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.interfaces import IReactorProcess
from twisted.python.failure import Failure

from sandboxd.core.archive.rsync import REMOTE, Rsync, RsyncFailed, WorkspaceEnd
from sandboxd.isolation.base import Identity
from tests.support.fakes import FakeReactor

ME = Identity(os.geteuid(), os.getegid())
SANDBOX = Identity(ME.uid + 1000, ME.gid + 1000)


def rsync(reactor: FakeReactor, binary: str, setpriv: str | None) -> Rsync:
    return Rsync(cast(IReactorProcess, reactor), binary, setpriv)


def end(identity: Identity = ME, join_files: tuple[str, ...] = ()) -> WorkspaceEnd:
    return WorkspaceEnd(identity, join_files, "/srv/sandboxes/s1/workspace")


@pytest.mark.parametrize("join", ["", "/sys/fs/cgroup/a b/cgroup.procs", "/cg/x\n"])
def test_a_cgroup_file_that_cannot_cross_the_shell_is_refused_unspawned(join: str) -> None:
    reactor = FakeReactor()
    with pytest.raises(RsyncFailed, match="whitespace in the path"):
        rsync(reactor, "/usr/bin/rsync", "/usr/bin/setpriv").with_workspace(
            end(join_files=(join,)), ["-a", REMOTE, "/archive/s1"]
        )
    assert reactor.spawned == []


def test_another_identity_without_setpriv_is_refused_unspawned() -> None:
    reactor = FakeReactor()
    with pytest.raises(RsyncFailed, match="no setpriv"):
        rsync(reactor, "/usr/bin/rsync", None).with_workspace(end(SANDBOX), ["-a", REMOTE, "/a"])
    assert reactor.spawned == []


def test_an_rsync_that_cannot_start_is_reported() -> None:
    reactor = FakeReactor(error=FileNotFoundError(2, "No such file or directory"))
    with pytest.raises(RsyncFailed, match=r"cannot start rsync: .*No such file or directory"):
        rsync(reactor, "/gone/rsync", None).local(["-a", "/archive/a/", "/archive/b"])
    (spawn,) = reactor.spawned
    assert spawn["path"] == "/"
    assert spawn["args"][:2] == ["/gone/rsync", "--timeout=120"]


def test_a_failed_rsync_reports_its_code_and_stderr_never_its_stdout() -> None:
    reactor = FakeReactor()
    done = rsync(reactor, "/usr/bin/rsync", None).local(["-a", "/archive/a/", "/archive/b"])
    assert reactor.process is not None and reactor.process.stdin_closed
    protocol = reactor.protocol
    protocol.childDataReceived(1, b"sending incremental file list\n")
    protocol.childDataReceived(2, b"rsync: open failed\nrsync error: code 23\n")
    protocol.processEnded(Failure(ProcessTerminated(exitCode=23)))
    failures: list[Failure] = []
    done.addErrback(failures.append)
    (failure,) = failures
    assert str(failure.value) == "rsync exited 23: rsync: open failed | rsync error: code 23"


@pytest.mark.parametrize(
    "ended", [ProcessDone(0), ProcessTerminated(exitCode=24)], ids=["0", "24-vanished"]
)
def test_exits_0_and_24_are_a_whole_copy(ended: Exception) -> None:
    reactor = FakeReactor()
    done = rsync(reactor, "/usr/bin/rsync", None).local(["-a", "/archive/a/", "/archive/b"])
    reactor.protocol.processEnded(Failure(ended))
    assert done.called and done.result is None


def test_a_silent_failure_says_so() -> None:
    reactor = FakeReactor()
    done = rsync(reactor, "/usr/bin/rsync", None).local(["/archive/a/", "/archive/b"])
    reactor.protocol.processEnded(Failure(ProcessTerminated(exitCode=None, signal=9)))
    failures: list[Failure] = []
    done.addErrback(failures.append)
    assert str(failures[0].value) == "rsync exited 137: no message"
