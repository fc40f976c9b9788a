"""The wire vocabulary of the HTTP front (docs/contract.rst, docs/extensions.rst): every JSON
body, every NDJSON frame and every error body the daemon sends is made here.

Errors go through one table, :data:`ERROR_TYPES`: a core error (or one of the front's own,
below) gives its HTTP status and its wire ``error`` type; anything not in the table is an
``500 InternalError``.
"""

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

import pybase64

import sandboxd
from sandboxd.core import (
    STDERR,
    CgroupStats,
    Chunk,
    Context,
    DiskUsage,
    Dropped,
    Ended,
    Outcome,
    Process,
    ProcessListing,
    ReaderEvent,
    Resolution,
    Sandbox,
    SandboxGone,
    SandboxListing,
    SpawnFailed,
    Template,
    context_events,
)
from sandboxd.errors import (
    ArchiveFailed,
    BadRequest,
    ContextNotFound,
    ContextsUnavailable,
    Draining,
    InsufficientStorage,
    NoCapacity,
    PathNotFound,
    ProcessConflict,
    ProcessNotFound,
    SandboxdError,
    SandboxNotFound,
    TemplateCannotRun,
    TemplateConflict,
    TemplateNotFound,
    TemplatesUnavailable,
    TemplateTooLarge,
    TerminalsUnavailable,
    TooMany,
    TooManyEntries,
)
from sandboxd.isolation.network.egress_policy import EgressPolicy
from sandboxd.ports.dial import PortClosed, PortsUnavailable
from sandboxd.web.body import TooLarge

JSON = b"application/json"
NDJSON = b"application/x-ndjson"
OCTETS = b"application/octet-stream"
TAR = b"application/x-tar"


class Unauthorized(SandboxdError):
    """Missing or wrong bearer token (a front's own refusal)."""


INTERNAL = (500, "InternalError")

ERROR_TYPES: Mapping[type[SandboxdError], tuple[int, str]] = {
    BadRequest: (400, "BadRequest"),
    Unauthorized: (401, "Unauthorized"),
    SandboxNotFound: (404, "SandboxNotFound"),
    PathNotFound: (404, "FileNotFoundError"),
    ProcessNotFound: (404, "ProcessNotFound"),
    ContextNotFound: (404, "ContextNotFound"),
    ContextsUnavailable: (501, "ContextsUnavailable"),
    ProcessConflict: (409, "Conflict"),
    TooLarge: (413, "TooLarge"),
    TooManyEntries: (413, "TooLarge"),
    TooMany: (429, "TooMany"),
    ArchiveFailed: (500, "ArchiveError"),
    Draining: (503, "Draining"),
    NoCapacity: (503, "NoCapacity"),
    InsufficientStorage: (507, "InsufficientStorage"),
    # Templates (docs/extensions.rst, "Templates"); BadArchive is a BadRequest
    TemplateNotFound: (404, "TemplateNotFound"),
    TemplateConflict: (409, "Conflict"),
    TemplateTooLarge: (413, "TooLarge"),
    TemplatesUnavailable: (503, "TemplatesUnavailable"),
    TemplateCannotRun: (501, "NotImplemented"),
    # Ports (docs/extensions.rst, "Ports")
    PortClosed: (502, "PortClosed"),
    PortsUnavailable: (409, "Conflict"),
    # Terminals (docs/extensions.rst, "Terminals")
    TerminalsUnavailable: (501, "NotImplemented"),
}
"""Core error → (HTTP status, wire ``error`` type); a subclass answers as its nearest base."""


def status_and_type(error: SandboxdError) -> tuple[int, str]:
    """The HTTP status and wire type of ``error`` (:data:`INTERNAL` when it has none)."""
    for kind in type(error).__mro__:
        if kind in ERROR_TYPES:
            return ERROR_TYPES[kind]
    return INTERNAL


def detail_of(error: SandboxdError) -> str:
    """The ``detail`` of an error body: its message, else its wire type."""
    return str(error.args[0]) if error.args else status_and_type(error)[1]


def body(value: Any) -> bytes:
    """A JSON body, as ``json.dumps`` writes it."""
    return json.dumps(value).encode()


def error_body(kind: str, detail: str) -> bytes:
    """The body of every error answer: ``{"error": <type>, "detail": <msg>}``."""
    return body({"error": kind, "detail": detail})


def core_error_body(error: SandboxdError) -> tuple[int, bytes]:
    """The status and error body answering ``error``."""
    status, kind = status_and_type(error)
    return status, error_body(kind, detail_of(error))


UNAUTHORIZED_DETAIL = "a valid 'Authorization: Bearer <token>' header is required"
"""The ``detail`` of every ``401``."""

BEARER_CHALLENGE = b'Bearer realm="sandboxd"'
"""The ``www-authenticate`` header of every ``401`` (RFC 9110 §11.6.1)."""


def unauthorized_answer() -> bytes:
    """A whole ``401`` answer, status line to body, that closes the connection: the channel's
    own, sent as soon as a request's headers show it lacks the token."""
    body = error_body("Unauthorized", UNAUTHORIZED_DETAIL)
    return (
        b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
        b"www-authenticate: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (BEARER_CHALLENGE, len(body), body)
    )


# Lifecycle bodies


def created_body(pod_url: str, sandbox: Sandbox) -> dict[str, Any]:
    """``POST /sandboxes``: where the new sandbox is served, and its id."""
    return {"pod_url": pod_url, "remote_id": sandbox.rid}


def stats_body(usage: CgroupStats, disk: DiskUsage) -> dict[str, Any]:
    """``GET stats``: what the cgroup and the disk layer count of the sandbox."""
    return {
        "memory_bytes": usage.memory_bytes,
        "memory_peak_bytes": usage.memory_peak_bytes,
        "cpu_usec": usage.cpu_usec,
        "pids": usage.pids,
        "oom_kills": usage.oom_kills,
        "disk_bytes": disk.bytes,
        "disk_limit_bytes": disk.bytes_limit,
        "files": disk.files,
        "files_limit": disk.files_limit,
    }


def sandboxes_body(listing: Iterable[SandboxListing]) -> dict[str, Any]:
    """``GET /sandboxes``: every live sandbox, for operators (its id as ``remote_id``)."""
    return {
        "sandboxes": [
            {
                "remote_id": s.rid,
                "created": s.created,
                "last_active": s.last_active,
                "ready": s.ready,
                "execs": s.execs,
                "network": network_body(s.network, s.egress),
            }
            for s in listing
        ]
    }


def network_body(mode: str, egress: EgressPolicy | None) -> dict[str, Any]:
    """A sandbox's network: its mode and, for a mode that takes one, its egress policy."""
    body: dict[str, Any] = {"mode": mode}
    if egress is not None:
        body.update(egress.to_json())
    return body


# The replica's own bodies


def health_body(draining: bool, capabilities: list[str]) -> dict[str, Any]:
    """``GET /healthz``: alive (``ok``, or ``draining``), its version and capabilities."""
    return {
        "status": "draining" if draining else "ok",
        "version": sandboxd.__version__,
        "capabilities": capabilities,
    }


def readiness_body(reason: str | None, isolation: str) -> tuple[int, dict[str, Any]]:
    """``GET /readyz``: ``503`` with the ``reason`` it takes no sandbox, else ``200`` naming
    its isolation."""
    if reason is not None:
        return 503, {"ready": False, "reason": reason}
    return 200, {"ready": True, "isolation": isolation}


def tools_body(answer: Resolution) -> dict[str, Any]:
    """``POST /tools/resolve``: ``{tools: {name: {sha, version, stale, commands}}, refused:
    {name: reason}}``."""
    tools = {
        name: {"sha": t.sha, "version": t.version, "stale": t.stale, "commands": t.commands}
        for name, t in answer.tools.items()
    }
    return {"tools": tools, "refused": answer.refused}


def field_body(name: str, value: object) -> dict[str, Any]:
    """A body of one field: ``{"ready": ...}``, ``{"exists": ...}``, ``{"size": ...}``..."""
    return {name: value}


# NDJSON frames of the exec stream

KEEPALIVE_FRAME = b'{"o":""}\n'
"""The frame sent while a command is silent (an empty live chunk)."""


def output_frame(data: bytes, key: bytes = b"o") -> bytes:
    """The NDJSON line of one live output chunk (``pybase64``: SIMD, much faster than
    ``base64`` for bulk output); ``key`` ``b"e"`` marks stderr (``split: true``)."""
    return b"".join((b'{"', key, b'":"', pybase64.b64encode(data), b'"}\n'))


def error_frame(kind: str, detail: str) -> bytes:
    """The in-band error frame ending an exec stream whose status line is already sent."""
    return frame_line({"error": kind, "detail": detail})


def in_band_error(error: BaseException) -> bytes:
    """The in-band error frame for a failure while running exec."""
    kind = status_and_type(error)[1] if isinstance(error, SandboxdError) else type(error).__name__
    return error_frame(kind, str(error))


def frame_line(frame: Mapping[str, Any]) -> bytes:
    """Any NDJSON line, as compact ``json.dumps``."""
    return json.dumps(frame, separators=(",", ":")).encode() + b"\n"


def final_frame(outcome: Outcome) -> dict[str, Any]:
    """The last frame of an exec stream for how the command ended."""
    if isinstance(outcome, SpawnFailed):
        return {"error": "SpawnFailed", "detail": outcome.detail}
    frame: dict[str, Any] = {
        "exit": outcome.code,
        "out": pybase64.b64encode_as_string(outcome.out),
        "err": pybase64.b64encode_as_string(outcome.err),
    }
    if outcome.truncated:
        frame["truncated"] = True
    if outcome.oom_killed:
        frame["oom_killed"] = True  # the sandbox reached SANDBOXD_MEMORY_MAX meanwhile
    return frame


_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_EXIT_KEYS = ["exit", "out", "err"]
_EXIT_MARKS = ("truncated", "oom_killed")
"""Keys an exit frame may carry after its output, each ``true`` or ``false``."""

PART_SIZE = 1 << 20
"""Bytes of an exit frame's base64 checked, encoded and written at a time."""


def _is_base64_text(value: object) -> bool:
    """``value`` is base64 text (which JSON writes as is), checked a megabyte at a time
    (``bytes.translate`` allocates a result as large as its input)."""
    if not isinstance(value, str) or not value.isascii():
        return False
    for start in range(0, len(value), PART_SIZE):
        if value[start : start + PART_SIZE].encode("ascii").translate(None, _BASE64):
            return False
    return True


def _slices(text: str) -> Iterator[bytes]:
    for start in range(0, len(text), PART_SIZE):
        yield text[start : start + PART_SIZE].encode("ascii")


def frame_parts(frame: Mapping[str, Any]) -> Iterator[bytes]:
    """An NDJSON line, in parts whose concatenation is the line.

    The exit frame carries up to ``max_output`` of output in base64: its parts are the very
    bytes ``json.dumps`` gives, its buffers a megabyte at a time, encoded as they are asked
    for. Written as the connection takes them, the line is never held whole as bytes, nor
    copied whole into the connection's buffer.
    """
    keys = list(frame)
    marks = keys[3:]
    if (
        keys[:3] == _EXIT_KEYS
        and type(frame["exit"]) is int
        and all(key in _EXIT_MARKS and type(frame[key]) is bool for key in marks)
    ):
        out, err = frame["out"], frame["err"]
        if _is_base64_text(out) and _is_base64_text(err):
            tail = b'"%s}\n' % b"".join(
                b',"%s":%s' % (key.encode(), b"true" if frame[key] else b"false") for key in marks
            )
            yield b'{"exit":%d,"out":"' % frame["exit"]
            yield from _slices(out)
            yield b'","err":"'
            yield from _slices(err)
            yield tail
            return
    yield frame_line(frame)


# The walk body

_WALK_ENTRY = '{"path": %s, "size": %d, "version": "%x.%x.%x.%x"}'
"""One entry of the walk body, as ``json.dumps`` writes it (the version of
:func:`sandboxd.core.files.workspace.version_of` inlined)."""


def walk_entries(where: str, found: Iterable[tuple[str, os.stat_result]]) -> list[str]:
    """The walk body's entries for the regular files ``found`` in directory ``where``
    (``/``-rooted, ``""`` for the workspace root)."""
    quote = encode_basestring_ascii
    entry = _WALK_ENTRY
    prefix = where + "/"
    return [
        entry
        % (quote(prefix + name), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        for name, st in found
    ]


WALK_HEAD, WALK_TAIL = b'{"entries": [', b"]}"
"""The walk body around its entries, for a walk written a part at a time."""


_SEPARATOR = ", "
"""Between two entries of the walk body."""


def walk_body(entries: list[str]) -> bytes:
    """The JSON body of ``GET walk``, ``{"entries": [{path, size, version}...]}``: the very
    bytes ``json.dumps`` gives, made without an object or a dict per entry."""
    return b"".join((WALK_HEAD, walk_part(entries, True), WALK_TAIL))


def walk_part(entries: list[str], first: bool) -> bytes:
    """Entries of a walk body written a part at a time: the parts joined are the very bytes of
    :func:`walk_body` (``WALK_HEAD``, the parts, ``WALK_TAIL``)."""
    joined = _SEPARATOR.join(entries)
    return (joined if first or not entries else _SEPARATOR + joined).encode("ascii")


def walk_too_large(most: int) -> TooManyEntries:
    """The error of a walk whose body passes ``most`` bytes (``SANDBOXD_WALK_BYTES_MAX``)."""
    return TooManyEntries(
        f"the walk's body passes {most} bytes (SANDBOXD_WALK_BYTES_MAX): walk a narrower root"
    )


def walk_size(batches: Iterator[list[str]], most: int) -> int:
    """The size in bytes of the walk body of ``batches`` (its entries are ASCII), counted
    as the walk goes, one batch in memory at a time: :func:`walk_too_large` as soon as it
    passes ``most``."""
    size = len(WALK_HEAD) + len(WALK_TAIL) - len(_SEPARATOR)  # no separator before the first
    for batch in batches:
        size += sum(map(len, batch)) + len(_SEPARATOR) * len(batch)
        if size > most:
            raise walk_too_large(most)
    return max(size, len(WALK_HEAD) + len(WALK_TAIL))


def next_walk_part(batches: Iterator[list[str]], budget: int) -> tuple[list[str], bool]:
    """Entries from ``batches`` (a walk's, one directory each) until they pass ``budget``
    characters; and whether the walk is done."""
    part: list[str] = []
    size = 0
    for batch in batches:
        part += batch
        size += sum(map(len, batch))
        if size >= budget:
            return part, False
    return part, True


# Background processes (docs/extensions.rst, "Background processes")

STREAM_KEEPALIVE_FRAME = b"{}\n"
"""The frame a process-output or watch stream sends while it has nothing to say."""


def process_started_body(process: Process) -> dict[str, Any]:
    """``POST processes``: the new process's id and pid."""
    return {"id": process.id, "pid": process.pid}


def processes_body(processes: Iterable[Process]) -> dict[str, Any]:
    """``GET processes``: every record of the sandbox, oldest first."""
    return {"processes": [process_json(p.listing()) for p in processes]}


def process_json(listed: ProcessListing) -> dict[str, Any]:
    """One record of ``GET processes``."""
    return {
        "id": listed.id,
        "pid": listed.pid,
        "tag": listed.tag,
        "cmd": list(listed.cmd),
        "started": listed.started,
        "running": listed.running,
        "exit": listed.exit,
        **({} if listed.pty is None else {"pty": {"rows": listed.pty[0], "cols": listed.pty[1]}}),
    }


def reader_frame(event: ReaderEvent) -> bytes:
    """The NDJSON line of one reader event (``b""`` for a reader that caught up: its
    stream simply ends)."""
    if isinstance(event, Chunk):
        key = b"e" if event.fd == STDERR else b"o"
        return b"".join(
            (b'{"', key, b'":"', pybase64.b64encode(event.data), b'","at":%d}\n' % event.at)
        )
    if isinstance(event, Dropped):
        return b'{"dropped":%d}\n' % event.count
    if isinstance(event, Ended):
        if event.code is None:
            return error_frame("SpawnFailed", event.detail)
        return b'{"exit":%d}\n' % event.code
    if isinstance(event, SandboxGone):
        return error_frame("SandboxNotFound", "the sandbox was killed")
    return b""


# Workspace watch (docs/extensions.rst, "Workspace watch")


def watch_frame(event: str, path: str | None = None, is_dir: bool = False) -> bytes:
    """One change under a watched root (``overflow`` has no path)."""
    if path is None:
        return frame_line({"event": event})
    return frame_line({"event": event, "path": path, "dir": is_dir})


# Templates (docs/extensions.rst, "Templates")


def template_body(template: Template) -> dict[str, Any]:
    """One template: ``{name, digest, size, env, workdir, created}``."""
    return {
        "name": template.name,
        "digest": template.digest,
        "size": template.size,
        "env": template.env,
        "workdir": template.workdir,
        "created": template.created,
    }


def templates_body(templates: Iterable[Template]) -> dict[str, Any]:
    """``GET /templates``: every template, by name."""
    return {"templates": [template_body(template) for template in templates]}


# Ports (docs/extensions.rst, "Ports")


def port_body(url: str, public: bool) -> dict[str, Any]:
    """A port's answer: where it is reached through this replica, and whether it is public."""
    return {"url": url, "public": public}


# Contexts (docs/extensions.rst, "Contexts")


def context_body(context: Context) -> dict[str, str]:
    """A context as ``POST /contexts`` and ``GET /contexts`` show it."""
    return context.describe()


def context_frame(event: context_events.Event) -> bytes:
    """One NDJSON line of ``POST /contexts/{cid}/run``, keyed by ``type``."""
    frame: dict[str, Any]
    if isinstance(event, context_events.Count):
        frame = {"type": "count", "execution_count": event.execution_count}
    elif isinstance(event, context_events.Output):
        frame = {"type": event.stream, "text": event.text}
    elif isinstance(event, context_events.Result):
        frame = {"type": "result", "is_main_result": event.is_main_result, "data": event.data}
    elif isinstance(event, context_events.Error):
        frame = {
            "type": "error",
            "name": event.name,
            "value": event.value,
            "traceback": list(event.traceback),
        }
    else:
        frame = {"type": "end"}
    return json.dumps(frame, separators=(",", ":")).encode() + b"\n"


# Terminals (docs/extensions.rst, "Terminals")


def terminal_body(process: Process) -> dict[str, Any]:
    """``POST terminals``: the new terminal's id, pid and size (its listing)."""
    return process_json(process.listing())


def terminals_body(processes: Iterable[Process]) -> dict[str, Any]:
    """``GET terminals``: the sandbox's terminals (the records of its processes that run on
    a terminal), oldest first."""
    listed = [p.listing() for p in processes]
    return {"terminals": [process_json(each) for each in listed if each.pty is not None]}


def terminal_end_message(event: ReaderEvent) -> str:
    """The last text message of a terminal's WebSocket: how it ended (``{"exit": CODE}``,
    ``{"error": ...}`` for one that never started or whose sandbox was killed)."""
    if isinstance(event, Ended) and event.code is not None:
        return json.dumps({"exit": event.code})
    if isinstance(event, Ended):
        return json.dumps({"error": "SpawnFailed", "message": event.detail})
    return json.dumps({"error": "SandboxNotFound", "message": "the sandbox was killed"})
