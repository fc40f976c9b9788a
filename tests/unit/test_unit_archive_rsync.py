"""Spawning rsync for the archive (``sandboxd.core.archive.rsync``) on a recording reactor: the
workspace end's chain handed to the remote shell, chains refused before anything runs, a spawn
that fails, and what an rsync's exit and output become."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import cast

import pytest
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.interfaces import IReactorProcess
from twisted.python.failure import Failure

from sandboxd.core.archive.rsync import REMOTE, RSH, RSH_SCRIPT, Rsync, RsyncFailed, WorkspaceEnd
from tests.support.fakes import FakeReactor

CHAIN = ["/opt/sandboxd-exec", "enter", "1", "/ns/a b/mnt", "sh", "-c", 'it\'s "quoted"\n']
"""A chain prefix with every kind of word rsync's ``-e`` parser could not carry."""


def rsync(reactor: FakeReactor, binary: str) -> Rsync:
    return Rsync(cast(IReactorProcess, reactor), binary)


def end(chain: Sequence[str] = CHAIN, last: str | None = None) -> WorkspaceEnd:
    return WorkspaceEnd(
        "/srv/sandboxes/s1/workspace",
        lambda argv: [*chain, *(argv if last is None else [last])],
    )


def test_the_chain_travels_word_by_word_to_the_remote_shell() -> None:
    reactor = FakeReactor()
    rsync(reactor, "/usr/bin/rsync").with_workspace(end(), ["-a", REMOTE, "/archive/s1"])
    (spawn,) = reactor.spawned
    assert spawn["path"] == "/", "root never sits in a workspace"
    assert f"--rsh={RSH}" in spawn["args"] and "--rsync-path=/usr/bin/rsync" in spawn["args"]
    env = spawn["env"]
    assert env["SANDBOXD_RSH_N"] == str(len(CHAIN))
    assert [env[f"SANDBOXD_RSH_{i}"] for i in range(len(CHAIN))] == CHAIN


def test_the_remote_shell_runs_the_chain_then_the_server_end_and_leaves_no_word_behind() -> None:
    words = ["/usr/bin/env", "printf", "[%s]"]
    env = {f"SANDBOXD_RSH_{i}": word for i, word in enumerate(words)}
    env["SANDBOXD_RSH_N"] = str(len(words))
    script = RSH_SCRIPT + "; exit 99"
    done = subprocess.run(
        ["/bin/sh", "-c", script, "sandboxd-rsh", "host", 'it\'s "x" $y', "--server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, '[it\'s "x" $y][--server]'), done.stderr
    leaked = subprocess.run(
        ["/bin/sh", "-c", RSH_SCRIPT, "sandboxd-rsh", "host"],
        env={"SANDBOXD_RSH_N": "1", "SANDBOXD_RSH_0": "/usr/bin/env"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert leaked.returncode == 0 and "SANDBOXD_RSH" not in leaked.stdout, leaked
    assert "'" not in RSH_SCRIPT  # it travels inside rsync's single quotes


@pytest.mark.parametrize(
    ("chain", "last", "why"),
    [
        (CHAIN, "/usr/bin/other", "does not end in /usr/bin/rsync"),
        ([], "", "does not end in /usr/bin/rsync"),
        (["sh", "-c", "a\0b"], None, "NUL byte"),
    ],
)
def test_a_chain_that_cannot_be_carried_is_refused_unspawned(
    chain: list[str], last: str | None, why: str
) -> None:
    reactor = FakeReactor()
    with pytest.raises(RsyncFailed, match=why):
        rsync(reactor, "/usr/bin/rsync").with_workspace(end(chain, last), ["-a", REMOTE, "/a"])
    assert reactor.spawned == []


def test_an_rsync_that_cannot_start_is_reported() -> None:
    reactor = FakeReactor(error=FileNotFoundError(2, "No such file or directory"))
    with pytest.raises(RsyncFailed, match=r"cannot start rsync: .*No such file or directory"):
        rsync(reactor, "/gone/rsync").local(["-a", "/archive/a/", "/archive/b"])
    (spawn,) = reactor.spawned
    assert spawn["path"] == "/"
    assert spawn["args"][:2] == ["/gone/rsync", "--timeout=120"]


def test_a_failed_rsync_reports_its_code_and_stderr_never_its_stdout() -> None:
    reactor = FakeReactor()
    done = rsync(reactor, "/usr/bin/rsync").local(["-a", "/archive/a/", "/archive/b"])
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
    done = rsync(reactor, "/usr/bin/rsync").local(["-a", "/archive/a/", "/archive/b"])
    reactor.protocol.processEnded(Failure(ended))
    assert done.called and done.result is None


def test_a_silent_failure_says_so() -> None:
    reactor = FakeReactor()
    done = rsync(reactor, "/usr/bin/rsync").local(["/archive/a/", "/archive/b"])
    reactor.protocol.processEnded(Failure(ProcessTerminated(exitCode=None, signal=9)))
    failures: list[Failure] = []
    done.addErrback(failures.append)
    assert str(failures[0].value) == "rsync exited 137: no message"
