"""The terminal runner and records without a daemon: what the kernel tests cannot make
happen on demand (a pty or a fork refused, a master gone under a resize or a signal)."""

import os
import signal
from typing import Any

import pytest
from twisted.internet.task import Clock

from sandboxd.core.exec.run import ExecRun, SpawnFailed
from sandboxd.core.layout import Layout
from sandboxd.core.processes.log import OutputLog
from sandboxd.core.processes.process import Ended, Process, SandboxGone
from sandboxd.core.processes.terminal import TerminalRun, TerminalSize
from sandboxd.errors import BadRequest, ProcessConflict
from sandboxd.http import wire
from sandboxd.isolation.base import Identity, Isolation, NoTerminals


class RefusingReactor:
    """Spawns nothing: the host refuses the fork."""

    def spawnProcess(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError(11, "Resource temporarily unavailable")


class Transport:
    """A stand-in for the pty transport: what was written, a master fd of our choosing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = b""

    def fileno(self) -> int:
        return self.fd

    def write(self, data: bytes) -> None:
        self.written += data


def terminal_run(kills: list[tuple[int, int]] | None = None) -> TerminalRun:
    record = kills if kills is not None else []
    return TerminalRun(
        Clock(),
        lambda fd, data: None,
        max_output=0,
        log_timeout=None,
        timeout=5,
        kill=lambda pid, signum: record.append((pid, signum)),
    )


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_refused_fork_ends_the_run_and_closes_the_pty() -> None:
    run = terminal_run()
    before = open_fds()
    run.start_terminal(RefusingReactor(), ["sh"], {}, TerminalSize(24, 80))  # type: ignore[arg-type]
    assert isinstance(run.outcome, SpawnFailed) and "cannot start" in run.outcome.detail
    assert open_fds() == before


def test_a_refused_pty_ends_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pty() -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "openpty", no_pty)
    run = terminal_run()
    run.start_terminal(RefusingReactor(), ["sh"], {}, TerminalSize(3, 4))  # type: ignore[arg-type]
    assert isinstance(run.outcome, SpawnFailed) and "pseudo-terminal" in run.outcome.detail


def test_resize_and_signals_without_a_master() -> None:
    kills: list[tuple[int, int]] = []
    run = terminal_run(kills)
    run.resize(TerminalSize(9, 9))  # not started: the size is kept for the listing
    assert run.size == TerminalSize(9, 9)
    run.signal_foreground(signal.SIGINT)
    assert kills == []
    run.transport = Transport(fd=10_000)  # type: ignore[assignment]
    run.pid = 4321
    run.resize(TerminalSize(5, 6))  # the master is gone: nothing to set, no error
    run.signal_foreground(signal.SIGINT)  # the foreground cannot be told: the command's group
    assert kills == [(4321, signal.SIGINT)]


def test_end_of_input_is_typed_as_ctrl_d() -> None:
    run = terminal_run()
    transport = Transport(fd=0)
    run.transport = transport  # type: ignore[assignment]
    run.stdin_open = True
    run.close_stdin()
    assert transport.written == b"\x04" and run.stdin_open


def test_a_process_on_no_terminal_or_ended_cannot_be_resized() -> None:
    plain = Process(
        "p",
        None,
        ("sleep",),
        0.0,
        ExecRun(Clock(), lambda fd, data: None, max_output=0, log_timeout=None, timeout=None),
        OutputLog(64),
        False,
    )
    with pytest.raises(ProcessConflict, match="not a terminal"):
        plain.resize(TerminalSize(1, 1))
    assert plain.listing().pty is None
    run = terminal_run()
    run.outcome = SpawnFailed("gone")
    ended = Process("t", None, ("sh",), 0.0, run, OutputLog(64), True)
    with pytest.raises(ProcessConflict, match="has ended"):
        ended.signal_foreground("INT")
    assert ended.listing().pty == (24, 80)


@pytest.mark.parametrize("rows", [True, 0, 4097, "24", None])
def test_sizes_are_whole_numbers_in_range(rows: object) -> None:
    with pytest.raises(BadRequest, match="rows"):
        TerminalSize.parse(rows, 80)


def test_the_end_messages_of_a_socket() -> None:
    assert wire.terminal_end_message(Ended(3)) == '{"exit": 3}'
    assert '"SpawnFailed"' in wire.terminal_end_message(Ended(None, "no fork"))
    assert '"SandboxNotFound"' in wire.terminal_end_message(SandboxGone())


def test_a_chain_without_ctty_has_no_terminals() -> None:
    isolation = Isolation(
        name="test",
        uids=None,  # type: ignore[arg-type]
        cgroups=type("C", (), {"join_files": lambda self, rid: []})(),
        fs=None,  # type: ignore[arg-type]
        wrap=lambda identity, joins, cwd, argv: list(argv),
        owns_files=False,
    )
    sandbox = isolation.attach("r", Identity(5, 5), Layout("/", False))
    assert sandbox.start_argv("/", ["sh"]) == ["sh"]
    with pytest.raises(NoTerminals):
        sandbox.start_argv("/", ["sh"], terminal=True)
