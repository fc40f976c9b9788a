"""envd's ``process.Process`` service on the core's background processes
(docs/extensions.rst, "Background processes").

Every command the SDK starts, foreground or background, is a core background process: its
output goes to the process's bounded log and the ``Start`` stream is one reader of that log
(from its first byte); ``Connect`` is another (from what comes next, as envd does). A client
that goes away changes nothing for the process; ``Connect-Timeout-Ms`` bounds the process
(as envd kills it then). Processes are found by pid among the sandbox's records.
"""

import signal as signals
from typing import Any, cast

from twisted.web.iweb import IRequest

from sandboxd.core import (
    Chunk,
    Ended,
    ExecSpec,
    Process,
    ReaderEvent,
    SandboxGone,
    SandboxManager,
    TerminalRun,
    TerminalSize,
    parse_env,
)
from sandboxd.e2b import wire
from sandboxd.e2b.paths import HOME, cwd_of, place_of
from sandboxd.e2b.registry import E2BSandbox
from sandboxd.e2b.wire import ConnectError, bool_field, int_field, object_field, text_field
from sandboxd.errors import BadRequest, ProcessConflict, ProcessNotFound, TerminalsUnavailable
from sandboxd.web.follow import FollowStream

SIGNAL_NAMES: dict[object, str] = {
    "SIGNAL_SIGKILL": "KILL",
    "SIGNAL_SIGTERM": "TERM",
    9: "KILL",
    15: "TERM",
}
KEEPALIVE_DEFAULT = 90.0
"""Seconds of silence before a keepalive event, without a ``Keepalive-Ping-Interval``."""


class EnvelopeStream(FollowStream):
    """A follow stream whose frames are Connect envelopes (keepalive: ``keepalive`` event)."""

    keepalive_frame = wire.PROCESS_KEEPALIVE

    def cut(self) -> None:
        """The sandbox is gone: drop the response's connection, with no end of stream, as
        E2B's proxy resets the stream of a sandbox that dies under it. Each SDK reads a
        dropped connection by asking ``/health`` (answered 502 ``was not found``) and raises
        its "killed or reached its end of life while the request was in flight"; e2b 2.45
        reads only that (an ``unavailable`` end would be its generic timeout error)."""
        cast(Any, self.request).transport.abortConnection()
        self.end()


def keepalive_of(request: IRequest) -> float:
    """The keepalive interval the client asked for (``Keepalive-Ping-Interval``, seconds)."""
    text = request.getHeader(b"keepalive-ping-interval")
    try:
        value = float(text) if text is not None else KEEPALIVE_DEFAULT
    except ValueError:
        return KEEPALIVE_DEFAULT
    return value if value > 0 else KEEPALIVE_DEFAULT


def timeout_of(request: IRequest) -> float | None:
    """``Connect-Timeout-Ms`` in seconds (``None``: none); ``invalid_argument`` if malformed."""
    text = request.getHeader(b"connect-timeout-ms")
    if text is None:
        return None
    if not text.isdigit() or len(text) > 10:
        raise ConnectError("invalid_argument", "connect-timeout-ms: not a number of ms")
    return int(text) / 1000 or None


def timed_out(process: Process) -> wire.ConnectError:
    """How a ``Start`` stream ends when ``Connect-Timeout-Ms`` ended its command: as envd's,
    with ``deadline_exceeded`` and no end event (the SDKs' timeout error, not an exit)."""
    return wire.ConnectError(
        "deadline_exceeded",
        f"process {process.pid}: the command reached its timeout (Connect-Timeout-Ms) "
        "and was killed",
    )


def end_frame(end: Ended) -> bytes:
    """The ``end`` event of a process that ended as ``end`` (envd's terms: a signal gives
    exit code -1 and ``signal: <name>``)."""
    if end.code is None:
        return wire.end_event(-1, False, "failed to start", end.detail or "failed to start")
    if end.signal is not None:
        name = signals.Signals(end.signal).name[3:].lower()
        status = f"signal: {'killed' if name == 'kill' else name}"
        return wire.end_event(-1, False, status, status)
    status = f"exit status {end.code}"
    return wire.end_event(end.code, True, status, None if end.code == 0 else status)


def _strings(value: object, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConnectError("invalid_argument", f"{field}: must be a list of strings")
    return list(value)


def select(entry: E2BSandbox, message: dict[str, Any]) -> Process:
    """The process a ``ProcessSelector`` names (by pid or tag); ``not_found`` otherwise."""
    selector = object_field(message, "process")
    try:
        if "tag" in selector:
            return entry.sandbox.processes.by_tag(text_field(selector, "tag"))
        return entry.sandbox.processes.by_pid(int_field(selector, "pid"))
    except ProcessNotFound as e:
        raise ConnectError("not_found", e.detail) from None


def running(entry: E2BSandbox, message: dict[str, Any]) -> Process:
    process = select(entry, message)
    if not process.running:
        raise ConnectError("not_found", f"process {process.pid} has ended")
    return process


async def start(
    manager: SandboxManager, entry: E2BSandbox, request: IRequest, message: dict[str, Any]
) -> None:
    """``Start``: run the command, stream its events until it ends."""
    config = object_field(message, "process")
    size = pty_size(message) if message.get("pty") is not None else None
    cmd = text_field(config, "cmd")
    args = _strings(config.get("args"), "args")
    try:
        envs = parse_env(config.get("envs"), "envs")
    except BadRequest as e:
        raise ConnectError("invalid_argument", e.detail) from None
    cwd = cwd_of(config["cwd"]) if config.get("cwd") else ()
    tag = message.get("tag")
    if tag is not None and not isinstance(tag, str):
        raise ConnectError("invalid_argument", "tag: must be a string")
    stdin = bool_field(message, "stdin")
    spec = ExecSpec((cmd, *args), envs, cwd, timeout_of(request), None, (), as_home=True)
    if size is None:
        process = manager.start_process(entry.sandbox, spec, tag=tag, stdin=stdin)
    else:
        try:
            process = manager.start_terminal(entry.sandbox, spec, size, tag=tag)
        except TerminalsUnavailable as e:
            raise ConnectError("unimplemented", e.detail) from None
    kept = {p.id for p in entry.sandbox.processes.all()}
    for gone in [key for key in entry.processes if key not in kept]:
        del entry.processes[gone]  # pushed out of the sandbox's records
    listed: dict[str, Any] = {"cmd": cmd, "args": args, "envs": envs}
    listed["cwd"] = place_of(config["cwd"]).display if config.get("cwd") else HOME
    entry.processes[process.id] = listed
    await process.run.when_started()  # its pid, from a spawn server's answer
    await follow(manager, entry, request, process, 0, bounded=True)


async def connect(
    manager: SandboxManager, entry: E2BSandbox, request: IRequest, message: dict[str, Any]
) -> None:
    """``Connect``: follow a process from now on (its end at once if it has ended)."""
    process = select(entry, message)
    await follow(manager, entry, request, process, None)


async def follow(
    manager: SandboxManager,
    entry: E2BSandbox,
    request: IRequest,
    process: Process,
    offset: int | None,
    bounded: bool = False,
) -> None:
    """Write the process's events to ``request`` until it ends (or the client goes).

    ``bounded``: the request's ``Connect-Timeout-Ms`` is the command's timeout (``Start``),
    so a command it ended ends the stream with ``deadline_exceeded``; any other stream is
    told the end as it was (exit code -1, killed)."""
    stream: EnvelopeStream | None = None

    def deliver(event: ReaderEvent) -> None:
        assert stream is not None
        if isinstance(event, Chunk):
            stream.write(wire.data_event(event.fd, event.data, pty=is_terminal(process)))
        elif isinstance(event, Ended) and bounded and event.timed_out:
            stream.write(wire.end_of_stream(timed_out(process)))
            stream.end()
        elif isinstance(event, Ended):
            stream.write(end_frame(event))
            stream.write(wire.end_of_stream())
            stream.end()
        elif isinstance(event, SandboxGone):
            stream.cut()

    reader = process.reader(offset, True, deliver)
    request.setResponseCode(200)
    request.setHeader(b"content-type", wire.CONNECT_JSON)
    request.write(wire.start_event(process.pid or 0))
    stream = EnvelopeStream(
        request, manager.clock, keepalive_of(request), reader.pause, reader.resume
    )
    try:
        stream.start()
        await stream.wait()
    finally:
        reader.stop()


def listing(entry: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
    """``List``: the running processes with the config they were started with."""
    processes = []
    for process in entry.sandbox.processes.running:
        config = entry.processes.get(process.id)
        if config is None:
            continue  # started through the native API
        info: dict[str, Any] = {"pid": process.pid, "config": config}
        if process.tag is not None:
            info["tag"] = process.tag
        processes.append(info)
    return {"processes": processes}


def _input_of(message: dict[str, Any], process: Process) -> bytes:
    """The bytes of a ``ProcessInput``: ``stdin``, or ``pty`` for a terminal (its keyboard is
    its stdin); ``pty`` bytes for a process on no terminal are ``failed_precondition``."""
    given = object_field(message, "input")
    if "pty" not in given:
        return wire.unb64(given.get("stdin", ""), "input.stdin")
    if not is_terminal(process):
        raise ConnectError("failed_precondition", f"process {process.pid} is not a PTY")
    return wire.unb64(given["pty"], "input.pty")


def _stdin(process: Process, data: bytes | None) -> None:
    """Write ``data`` to the process's stdin (``None``: close it)."""
    try:
        if data is None:
            process.close_stdin()
        else:
            process.write_stdin(data)
    except ProcessConflict as e:
        raise ConnectError("failed_precondition", e.detail) from None


def send_input(entry: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
    process = running(entry, message)
    data = _input_of(message, process)
    _stdin(process, data)
    return {}


def stream_input(entry: E2BSandbox, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """``StreamInput`` (the body whole): a start event naming the process, then data."""
    process: Process | None = None
    for message in messages:
        if "start" in message:
            process = running(entry, object_field(message, "start"))
        elif "data" in message:
            if process is None:
                raise ConnectError("invalid_argument", "data before the start event")
            _stdin(process, _input_of(object_field(message, "data"), process))
    return {}


def close_stdin(entry: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
    process = running(entry, message)
    _stdin(process, None)
    return {}


def send_signal(entry: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
    process = running(entry, message)
    name = SIGNAL_NAMES.get(message.get("signal"))
    if name is None:
        raise ConnectError("invalid_argument", "signal: SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    process.signal(name)  # running: no ProcessConflict
    return {}


# Terminals (docs/e2b.rst, "Coverage"; docs/extensions.rst, "Terminals")


def is_terminal(process: Process) -> bool:
    return isinstance(process.run, TerminalRun)


def pty_size(message: dict[str, Any]) -> TerminalSize:
    """The ``PTY`` of a ``Start`` or ``Update``: its ``size`` (rows, cols)."""
    size = object_field(object_field(message, "pty"), "size")
    try:
        return TerminalSize.parse(size.get("rows"), size.get("cols"))
    except BadRequest as e:
        raise ConnectError("invalid_argument", f"pty.size: {e.detail}") from None


def update(entry: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
    """``Update``: a terminal's new window size (an ``Update`` without ``pty`` changes
    nothing)."""
    process = running(entry, message)
    if message.get("pty") is None:
        return {}
    if not is_terminal(process):
        raise ConnectError("failed_precondition", f"process {process.pid} is not a PTY")
    process.resize(pty_size(message))
    return {}
