"""
Value types and exceptions of the sandboxd client (docs/client.rst, "HttpSandbox").

Every value is an immutable attrs class. Exceptions follow the error model
(docs/client.rst, "Errors and retries"): each one tells the application what to do next, so
each one is raised only for the situation it names.

- ``SandboxNotFound``: the sandbox is gone (unknown handle, killed, or its replica is dead).
  The application recreates it from its own store.
- ``SandboxBusy``: the replica is reachable but did not answer in time. The sandbox is alive;
  do **not** open a second one for the same work.
- ``SandboxUnavailable``: the service refused to create a sandbox (503 draining / no capacity),
  or the load balancer in front of it could not be reached.
- builtin ``FileNotFoundError`` (missing path), ``ValueError`` (400: bad request, bad handle),
  ``PermissionError`` (401/403: missing or wrong bearer token), ``OSError(ENOSPC)`` (507).
- ``SandboxError``: the base of the classes above that are ours, and what any other
  failure (413, 500, a malformed reply) is raised as.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from attrs import field, frozen

from ._socks5 import Socks5


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _strs(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _opt_strs(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


def _rules(value: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    return {host: dict(headers) for host, headers in value.items()}


def _rule_names(value: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    return {host: tuple(names) for host, names in value.items()}


def _objects(values: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(values)


class SandboxError(Exception):
    """
    A failure reported by (or on the way to) a sandboxd host.

    ``status`` is the HTTP status when there was one (``None`` for transport failures and
    in-band exec errors), ``error`` the wire error type (e.g. ``"TooLarge"``) and ``detail`` the
    human-readable message.
    """

    def __init__(self, detail: str, *, status: int | None = None, error: str | None = None):
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.error = error


class SandboxNotFound(SandboxError):
    """The sandbox does not exist (any more), or the replica holding it is dead."""


class SandboxBusy(SandboxError):
    """The replica is reachable but too slow: the sandbox is presumed alive."""


class SandboxUnavailable(SandboxError):
    """The service cannot take the request now (503 draining / no capacity, or unreachable)."""


class ProtocolError(SandboxError):
    """The reply does not follow the wire contract (garbage body, missing fields)."""


class TooLarge(SandboxError, ValueError):
    """413: the request body is over the host's limit. Also a ``ValueError``."""


@frozen
class SandboxSpec:
    """What to create: every field is optional (docs/contract.rst, "Routes"; ``network``:
    docs/extensions.rst, "Network mode")."""

    image: str | None = None
    env: Mapping[str, str] = field(factory=dict)
    exposed_ports: tuple[int, ...] = field(default=(), converter=_ints)
    item_id: str | None = None
    network: str | None = None
    """``"none"``, ``"egress"`` or ``"host"`` (docs/extensions.rst, "Network mode"); ``None``:
    the host's default (and nothing is sent, so a host without network modes sees the old
    body)."""
    allow_out: tuple[str, ...] | None = field(default=None, converter=_opt_strs)
    """An ``egress`` sandbox's own allow list: addresses, CIDRs and host names
    (docs/isolation.rst, "Egress policy per sandbox", "Egress by name"); ``None``: everything
    the operator permits."""
    deny_out: tuple[str, ...] = field(default=(), converter=_strs)
    """Addresses, CIDRs and host names it may not reach (wins over ``allow_out``)."""
    rules: Mapping[str, Mapping[str, str]] = field(factory=dict, converter=_rules, repr=False)
    """An ``egress`` sandbox's header rules, ``{host: {header: value}}``: headers set on
    every plain HTTP request it sends to that host (``api.example.com`` or
    ``*.example.com``), whose values it never holds (docs/isolation.rst, "Header rules"). The
    values are secrets: not in the ``repr``."""
    socks5: Socks5 | None = None
    """An ``egress`` sandbox's own SOCKS5 proxy, which all its TCP leaves through
    (docs/isolation.rst, "A sandbox's own SOCKS5 proxy"); ``None``: none."""
    template: str | None = None
    """The template whose files are the sandbox's root (docs/extensions.rst, "Templates");
    ``None``: the host's root, and nothing is sent."""

    def to_json(self) -> dict[str, Any]:
        """The request body: fields left at their defaults are not sent."""
        body: dict[str, Any] = {}
        if self.image is not None:
            body["image"] = self.image
        if self.env:
            body["env"] = dict(self.env)
        if self.exposed_ports:
            body["exposed_ports"] = list(self.exposed_ports)
        if self.item_id is not None:
            body["item_id"] = self.item_id
        if self.allow_out is not None or self.deny_out or self.rules or self.socks5 is not None:
            body["network"] = network_lists(
                self.network, self.allow_out, self.deny_out, self.rules, self.socks5
            )
        elif self.network is not None:
            body["network"] = self.network
        if self.template is not None:
            body["template"] = self.template
        return body


def network_lists(
    mode: str | None,
    allow_out: tuple[str, ...] | None,
    deny_out: tuple[str, ...],
    rules: Mapping[str, Mapping[str, str]] | None = None,
    socks5: Socks5 | None = None,
) -> dict[str, Any]:
    """The object form of a create's ``network``: the lists, rules and proxy given (no mode:
    ``egress``)."""
    body: dict[str, Any] = {"mode": mode or "egress", "deny_out": list(deny_out)}
    if allow_out is not None:
        body["allow_out"] = list(allow_out)
    if rules:
        body["rules"] = rules_body(rules)
    if socks5 is not None:
        body["socks5"] = socks5.to_json()
    return body


def rules_body(rules: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """Header rules as the wire takes them: ``{host: [{"headers": {name: value}}]}``."""
    return {host: [{"headers": dict(headers)}] for host, headers in rules.items()}


@frozen
class SandboxHandle:
    """
    An opaque, storable reference to one sandbox.

    ``id`` is base64 of ``{"u": pod_url, "r": remote_id}`` (see ``sandboxd_client._handles``),
    so any client replica can route it without shared state.
    """

    id: str


@frozen
class ExecResult:
    """
    The outcome of one command: a non-zero ``exit_code`` is a result, not an error.

    ``stdout``/``stderr`` are the separate buffers of the final frame; ``truncated`` is true when
    the host capped them (the live ``on_output`` stream is never capped).
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool = False


@frozen
class WalkEntry:
    """One regular file under a walked root: workspace-relative path, size, opaque version."""

    path: str
    size: int
    version: str | int


@frozen
class ResolvedTool:
    """A tool the host installed: mount it by ``sha``; ``commands`` is the schema for the model."""

    sha: str
    version: str
    stale: bool
    commands: tuple[Mapping[str, Any], ...] = field(converter=_objects)


@frozen
class ToolsResolution:
    """Per-tool answer of ``resolve_tools``: resolved tools and refused ones with a reason."""

    tools: Mapping[str, ResolvedTool]
    refused: Mapping[str, str]


@frozen
class Health:
    """``GET /healthz``: status, daemon version and the capability names it implements."""

    status: str
    version: str
    capabilities: tuple[str, ...] = field(converter=_strs)


@frozen
class SandboxInfo:
    """One live sandbox as listed by ``GET /sandboxes`` (for operators)."""

    remote_id: str
    created: float | str | None
    last_active: float | str | None
    ready: bool
    execs: int
    network: NetworkInfo | None = None
    """Its network mode and egress lists (``None``: a host that does not say)."""
    template: str | None = None
    """The template it was made from (``None``: the host's root, or a host that does not
    say)."""


@frozen
class NetworkInfo:
    """A sandbox's network: its mode and, for ``egress``, its lists (``allow_out`` ``None``:
    everything the operator permits)."""

    mode: str
    allow_out: tuple[str, ...] | None = field(default=None, converter=_opt_strs)
    deny_out: tuple[str, ...] = field(default=(), converter=_strs)
    rules: Mapping[str, tuple[str, ...]] = field(factory=dict, converter=_rule_names)
    """Each host's header rule, as the host shows it: the header names, never the values."""
    socks5: Socks5 | None = None
    """Its own SOCKS5 proxy as the host shows it: address, user name and TLS, never the
    password (``None``: none)."""


@frozen
class SandboxStats:
    """``GET /sandboxes/{rid}/stats``: cgroup counters of one sandbox."""

    memory_bytes: int | None
    memory_peak_bytes: int | None
    cpu_usec: int | None
    pids: int | None
    oom_kills: int | None
    cpus: tuple[int, ...] | None = None
    """The CPUs the sandbox runs on, where the daemon places it (``None``: not placed, or a
    daemon that does not say)."""


class ContextNotFound(SandboxError, LookupError):
    """404 ``ContextNotFound``: no such interpreter context in the sandbox (or it was
    removed). Also a ``LookupError``."""


class ProcessNotFound(SandboxError, LookupError):
    """404 ``ProcessNotFound``: no such background process in the sandbox (or its record
    was pushed out). Also a ``LookupError``."""


@frozen
class ProcessInfo:
    """One background process of a sandbox (``exit_code`` is ``None`` while it runs)."""

    id: str
    pid: int | None
    tag: str | None
    cmd: tuple[str, ...]
    started: float
    running: bool
    exit_code: int | None


@frozen
class OutputChunk:
    """``data`` a background process wrote on ``stream`` (``"stdout"`` or ``"stderr"``), its
    first byte at byte offset ``at`` of the process's output."""

    stream: str
    data: bytes
    at: int

    @property
    def end(self) -> int:
        """The offset to resume reading at after this chunk."""
        return self.at + len(self.data)


@frozen
class ProcessOutput:
    """How a read of a process's output ended: ``exit_code`` once the process ended
    (``None``: it runs on, the read did not follow), ``offset`` to resume at, and the bytes
    ``dropped`` (fallen out of the host's log before they were read)."""

    exit_code: int | None
    offset: int
    dropped: int


@frozen
class WatchEvent:
    """A change under a watched root: ``event`` is ``create``, ``write``, ``remove``,
    ``rename``, ``chmod`` or ``overflow`` (events were lost: walk again; no ``path``)."""

    event: str
    path: str | None
    dir: bool


class TemplateNotFound(SandboxError, LookupError):
    """404 ``TemplateNotFound``: no template of that name on the replica. Also a
    ``LookupError``."""


class TemplateBuildFailed(SandboxError):
    """A template build whose step failed (docs/extensions.rst, "Building a template"): the
    step's number, its Dockerfile line and instruction, why, its output's last lines and, for
    a ``RUN``, its exit code. Nothing of the build is left on the replica."""

    def __init__(self, frame: Mapping[str, Any]) -> None:
        self.step = frame.get("step")
        self.line = frame.get("line")
        self.instruction = frame.get("instruction")
        self.exit_code = frame.get("exit_code")
        output = frame.get("output")
        self.output = [str(line) for line in output] if isinstance(output, list) else []
        super().__init__(
            f"step {self.step} (line {self.line}: {self.instruction}) failed: {frame.get('error')}"
        )


@frozen
class TemplateInfo:
    """One template of a replica (docs/extensions.rst, "Templates")."""

    name: str
    digest: str
    """``sha256:<hex>`` of the archive it was imported from."""
    size: int
    """Bytes of its files."""
    env: Mapping[str, str]
    workdir: str
    created: float
    """When its import started (seconds since the epoch)."""
