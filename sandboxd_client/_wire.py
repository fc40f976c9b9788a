"""
Wire contract v1 (docs/contract.rst): request bodies and the decoding of JSON replies into values.

Pure functions, no I/O. Every decoder checks the fields it reads and raises ``ProtocolError``
for a reply that does not follow the contract, so a garbage ``200`` never turns into a
plausible-looking value. Unknown extra fields are ignored (compatible extensions).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ._handles import encode_handle
from ._socks5 import Socks5, Socks5TLS
from ._types import (
    Health,
    NetworkInfo,
    ProcessInfo,
    ProtocolError,
    ResolvedTool,
    SandboxHandle,
    SandboxInfo,
    SandboxStats,
    ToolsResolution,
    WalkEntry,
)

T = TypeVar("T")

JSON = b"application/json"


def json_bytes(payload: object) -> bytes:
    """A request body: compact UTF-8 JSON."""
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def _obj(reply: object, what: str) -> dict[str, Any]:
    if not isinstance(reply, dict):
        raise ProtocolError(f"{what}: expected a JSON object, got {type(reply).__name__}")
    return reply


def _get(reply: Mapping[str, Any], key: str, kind: type[T] | tuple[type, ...], what: str) -> T:
    value = reply.get(key)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ProtocolError(f"{what}: field {key!r} missing or of the wrong type: {value!r:.80}")
    return value  # type: ignore[return-value]


def _opt_int(reply: Mapping[str, Any], key: str, what: str) -> int | None:
    value = reply.get(key)
    if value is None:
        return None
    return _get(reply, key, int, what)


def exec_body(
    cmd: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    stdin: bytes | None,
    tools: Sequence[str] | None,
) -> dict[str, Any]:
    """The ``POST /exec`` body; ``ValueError`` for a malformed command (before any request)."""
    if isinstance(cmd, str | bytes) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise ValueError("cmd must be a non-empty list of strings (argv), not a shell string")
    body: dict[str, Any] = {"cmd": list(cmd)}
    if env:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env must map strings to strings")
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        body["timeout"] = timeout
    if stdin is not None:
        body["stdin"] = base64.b64encode(bytes(stdin)).decode("ascii")
    if tools:
        if isinstance(tools, str) or not all(isinstance(t, str) for t in tools):
            raise ValueError("tools must be a list of tool shas")
        body["tools"] = list(tools)
    return body


def decode_created(reply: object) -> SandboxHandle:
    """``POST /sandboxes`` → a handle routing to the replica that created the sandbox."""
    obj = _obj(reply, "create")
    pod_url = _get(obj, "pod_url", str, "create")
    remote_id = _get(obj, "remote_id", str, "create")
    try:
        return encode_handle(pod_url, remote_id)
    except ValueError as e:
        raise ProtocolError(f"create: unusable reply: {e}") from None


def decode_field(reply: object, key: str, kind: type[T], what: str) -> T:
    """One typed field of a JSON object reply (``{exists}``, ``{bytes}``, ``{ready}``)."""
    return _get(_obj(reply, what), key, kind, what)


def decode_size(reply: object) -> int | None:
    """``GET size`` → the size, or ``None`` when the file is absent."""
    return _opt_int(_obj(reply, "size"), "size", "size")


def decode_walk(reply: object) -> list[WalkEntry]:
    """``GET walk`` → one ``WalkEntry`` per regular file.

    Checked as strictly as every other reply, at a cost per entry that matters for walks of
    hundreds of thousands of files: the exact types JSON decodes to are checked inline, and
    only an entry that is not made of them goes through the general checks (which raise
    ``ProtocolError``, or accept it).
    """
    entries = _get(_obj(reply, "walk"), "entries", list, "walk")
    out: list[WalkEntry] = []
    append = out.append
    for entry in entries:
        if type(entry) is dict:
            path, size, version = entry.get("path"), entry.get("size"), entry.get("version")
            if (
                type(path) is str
                and type(size) is int
                and (type(version) is str or type(version) is int)
            ):
                append(WalkEntry(path, size, version))
                continue
        append(_walk_entry(entry))
    return out


def _walk_entry(entry: object) -> WalkEntry:
    e = _obj(entry, "walk entry")
    return WalkEntry(
        path=_get(e, "path", str, "walk entry"),
        size=_get(e, "size", int, "walk entry"),
        version=_get(e, "version", (str, int), "walk entry"),
    )


def decode_tools(reply: object) -> ToolsResolution:
    """``POST /tools/resolve`` → resolved tools and refusals, per tool."""
    obj = _obj(reply, "resolve_tools")
    tools: dict[str, ResolvedTool] = {}
    for name, value in _get(obj, "tools", dict, "resolve_tools").items():
        t = _obj(value, f"tool {name}")
        commands = _get(t, "commands", list, f"tool {name}") if "commands" in t else []
        tools[name] = ResolvedTool(
            sha=_get(t, "sha", str, f"tool {name}"),
            version=_get(t, "version", str, f"tool {name}"),
            stale=bool(t.get("stale", False)),
            commands=tuple(_obj(c, f"tool {name} command") for c in commands),
        )
    refused_raw = obj.get("refused") or {}
    refused = {str(k): str(v) for k, v in _obj(refused_raw, "resolve_tools refused").items()}
    return ToolsResolution(tools=tools, refused=refused)


def decode_health(reply: object) -> Health:
    """``GET /healthz`` → ``Health``."""
    obj = _obj(reply, "healthz")
    caps = obj.get("capabilities") or []
    if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
        raise ProtocolError("healthz: capabilities must be a list of strings")
    return Health(
        status=_get(obj, "status", str, "healthz"),
        version=str(obj.get("version", "")),
        capabilities=tuple(caps),
    )


def decode_list(reply: object) -> list[SandboxInfo]:
    """``GET /sandboxes`` → one ``SandboxInfo`` per live sandbox."""
    out = []
    for item in _get(_obj(reply, "list"), "sandboxes", list, "list"):
        s = _obj(item, "list entry")
        out.append(
            SandboxInfo(
                remote_id=_get(s, "remote_id", str, "list entry"),
                created=s.get("created"),
                last_active=s.get("last_active"),
                ready=bool(s.get("ready", False)),
                execs=_opt_int(s, "execs", "list entry") or 0,
                network=None if s.get("network") is None else decode_network(s["network"]),
                template=s.get("template") if isinstance(s.get("template"), str) else None,
            )
        )
    return out


def decode_network(reply: object) -> NetworkInfo:
    """``GET``/``PUT /sandboxes/{rid}/network`` (and a list entry's ``network``)."""
    obj = _obj(reply, "network")
    allow = obj.get("allow_out")
    rules = _obj(obj.get("rules") or {}, "network rules")
    return NetworkInfo(
        mode=_get(obj, "mode", str, "network"),
        allow_out=None if allow is None else _strings(allow, "network allow_out"),
        deny_out=_strings(obj.get("deny_out", []), "network deny_out"),
        rules={host: _strings(names, "network rules") for host, names in rules.items()},
        socks5=decode_socks5(obj.get("socks5")),
    )


def decode_socks5(value: object) -> Socks5 | None:
    """A listed network's ``socks5`` (``None``: no proxy of its own): its address, user
    name and TLS (:func:`decode_socks5_tls`)."""
    if value is None:
        return None
    obj = _obj(value, "network socks5")
    username = obj.get("username")
    if username is not None and not isinstance(username, str):
        raise ProtocolError("network socks5: username must be a string")
    tls = decode_socks5_tls(obj.get("tls"))
    return Socks5(_get(obj, "address", str, "network socks5"), username, tls=tls)


def decode_socks5_tls(tls: object) -> bool | Socks5TLS:
    """A listed proxy's ``tls``, which the host shows as ``{"enabled": true, "server_name":
    ...}`` (never the CA): a :class:`Socks5TLS` of that server name, ``True`` when on without
    one (as ``Socks5TLS()`` would be sent), ``False`` when off or absent."""
    if not isinstance(tls, dict):
        return tls is True
    if tls.get("enabled", True) is not True:
        return False
    name = tls.get("server_name")
    if name is None:
        return True
    if not isinstance(name, str):
        raise ProtocolError("network socks5: tls server_name must be a string")
    return Socks5TLS(name)


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"{what}: expected a list of strings")
    return tuple(value)


def decode_stats(reply: object) -> SandboxStats:
    """``GET /sandboxes/{rid}/stats`` → ``SandboxStats`` (absent counters are ``None``)."""
    obj = _obj(reply, "stats")
    cpus = obj.get("cpus")
    if cpus is not None and (
        not isinstance(cpus, list) or not all(type(c) is int and c >= 0 for c in cpus)
    ):
        raise ProtocolError("stats: cpus: expected a list of CPU numbers")
    return SandboxStats(
        **{
            k: _opt_int(obj, k, "stats")
            for k in ("memory_bytes", "memory_peak_bytes", "cpu_usec", "pids", "oom_kills")
        },
        cpus=None if cpus is None else tuple(cpus),
    )


def decode_started(reply: object) -> tuple[str, int | None]:
    """``POST processes``: ``(id, pid)``."""
    obj = _obj(reply, "process start")
    return _get(obj, "id", str, "process start"), _opt_int(obj, "pid", "process start")


def decode_processes(reply: object) -> list[ProcessInfo]:
    """``GET processes``: the records."""
    items = _get(_obj(reply, "processes"), "processes", list, "processes")
    found = []
    for item in items:
        entry = _obj(item, "process")
        cmd = _get(entry, "cmd", list, "process")
        tag = entry.get("tag")
        started: float = _get(entry, "started", (int, float), "process")
        found.append(
            ProcessInfo(
                id=_get(entry, "id", str, "process"),
                pid=_opt_int(entry, "pid", "process"),
                tag=tag if isinstance(tag, str) else None,
                cmd=tuple(str(a) for a in cmd),
                started=float(started),
                running=bool(_get(entry, "running", bool, "process")),
                exit_code=_opt_int(entry, "exit", "process"),
            )
        )
    return found
