"""The E2B control plane: create, connect, get, list, kill and timeout of sandboxes.

A create makes a core sandbox (the same manager, isolation and limits as the native API) and
registers it with its own access token. Only the default template (``base``) exists; the
features that have no meaning here (auto-pause, volumes, MCP gateway) are refused, never
ignored.
"""

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from twisted.web.iweb import IRequest

from sandboxd.e2b import interpreter, wire
from sandboxd.e2b.registry import TIMEOUT_DEFAULT, E2BSandbox
from sandboxd.e2b.wire import RestError
from sandboxd.errors import BadRequest

if TYPE_CHECKING:
    from sandboxd.e2b.api import E2BFront

ENVD_VERSION = "0.5.7"
"""The envd version the front advertises: commands with stdin and ``close_stdin``,
octet-stream and gzip uploads; not write metadata (0.6.2) nor watch entries (0.6.3)."""
TEMPLATES = ("base",)
CLIENT_ID = "sandboxd"
REFUSED_FIELDS = ("autoPause", "autoResume", "mcp", "volumeMounts", "network", "iam")
LIST_LIMIT_MAX = 1000


def _json_body(request: IRequest) -> dict[str, Any]:
    content = request.content
    content.seek(0)
    try:
        return wire.parse_message(content.read(1 << 20))
    except wire.ConnectError as e:
        raise RestError(400, e.message) from None


def _timeout(body: dict[str, Any], default: float | None) -> float | None:
    value = body.get("timeout", default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise RestError(400, "timeout: must be a number of seconds")
    return float(value)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def sandbox_json(entry: E2BSandbox) -> dict[str, Any]:
    """The ``Sandbox`` a create or connect answers."""
    return {
        "templateID": entry.template,
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": entry.token,
        "trafficAccessToken": entry.token,  # the code interpreter's calls carry it
        "domain": None,
    }


def detail_json(front: "E2BFront", entry: E2BSandbox) -> dict[str, Any]:
    """The ``SandboxDetail`` (and ``ListedSandbox``) of a sandbox; ``allowInternetAccess`` says
    whether its network mode reaches beyond its loopback (``egress``, ``host``)."""
    config = front.manager.config
    return {
        "templateID": entry.template,
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "startedAt": _when(entry.started_at),
        "endAt": _when(entry.end_at),
        "envdVersion": ENVD_VERSION,
        "cpuCount": max(1, math.ceil(config.cpu_cores)),
        "memoryMB": config.memory_max >> 20,
        "diskSizeMB": (config.disk_max or 0) >> 20,
        "state": "running",
        "metadata": entry.metadata,
        "allowInternetAccess": entry.sandbox.network != "none",
    }


def internet_mode(front: "E2BFront", internet: object) -> str:
    """The network mode for ``allow_internet_access`` (absent or null: ``true``, as in E2B).

    ``false`` is ``none`` (the sandbox's own loopback alone). ``true`` is ``egress`` where this
    replica offers and allows it, else ``host`` where that is the replica's default (no
    network namespaces: the sandbox has the host's network); otherwise a ``400`` naming why
    egress is missing and the setting, never a sandbox with its loopback alone
    (docs/e2b.rst, "Networking")."""
    if internet is False:
        return "none"
    if internet not in (None, True):
        raise RestError(400, "allow_internet_access: must be true or false")
    policy = front.manager.isolation.namespaces.network
    try:
        policy.mode("egress")
    except ValueError as e:
        if policy.default == "host":
            return "host"
        raise RestError(
            400,
            f"allow_internet_access: {e}; allow_internet_access=False creates a sandbox"
            " without network",
        ) from None
    return "egress"


def _answer(request: IRequest, status: int, value: Any) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", wire.JSON)
    return wire.body(value)


async def create(front: "E2BFront", request: IRequest) -> bytes:
    body = _json_body(request)
    template = body.get("templateID", "base")
    if template == interpreter.TEMPLATE:
        missing = front.manager.contexts_missing()
        if missing is not None:
            raise RestError(400, f"template {template!r}: contexts are not available: {missing}")
    elif template not in TEMPLATES:
        raise RestError(
            400, f"template {template!r}: sandboxd has only the default template 'base'"
        )
    for name in REFUSED_FIELDS:
        if body.get(name):
            raise RestError(400, f"{name}: not supported by sandboxd")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise RestError(400, "metadata: must be an object of strings")
    timeout = _timeout(body, TIMEOUT_DEFAULT)
    network = internet_mode(front, body.get("allow_internet_access"))
    try:
        sandbox = await front.manager.create_restored(env=body.get("envVars"), network=network)
    except BadRequest as e:
        raise RestError(400, e.detail) from None
    entry = front.registry.add(sandbox, template, dict(metadata), timeout or TIMEOUT_DEFAULT)
    return _answer(request, 201, sandbox_json(entry))


def connect(front: "E2BFront", request: IRequest, sandbox_id: str) -> bytes:
    entry = front.registry.get(sandbox_id)
    timeout = _timeout(_json_body(request), None)
    if timeout is not None:
        front.registry.extend(entry, timeout)
    return _answer(request, 200, sandbox_json(entry))


def get_info(front: "E2BFront", request: IRequest, sandbox_id: str) -> bytes:
    return _answer(request, 200, detail_json(front, front.registry.get(sandbox_id)))


def set_timeout(front: "E2BFront", request: IRequest, sandbox_id: str) -> bytes:
    entry = front.registry.get(sandbox_id)
    timeout = _timeout(_json_body(request), None)
    if timeout is None:
        raise RestError(400, "timeout: required")
    front.registry.set_timeout(entry, timeout)
    request.setResponseCode(204)
    return b""


def _arg(request: IRequest, name: str) -> str | None:
    values = (request.args or {}).get(name.encode())
    return values[0].decode("utf-8", "replace") if values else None


def metadata_filter(text: str | None) -> dict[str, str]:
    """The list's ``metadata`` query value: form-encoded pairs of percent-quoted text."""
    if not text:
        return {}
    return {unquote(k): unquote(v) for k, v in parse_qsl(text, keep_blank_values=True)}


def _started_after(text: str | None) -> datetime | None:
    """The ``startedAfter`` bound (ISO 8601; a time without an offset is UTC)."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise RestError(400, f"startedAfter: {text!r} is not an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when


def _filter(request: IRequest) -> Callable[[E2BSandbox], bool]:
    """Whether a sandbox passes the list's filters: ``state`` (all are ``running``),
    ``metadata`` (every pair), ``template`` (its name), ``startedAfter`` (at or after, to the
    microsecond: the ``startedAt`` a client was given is as late as itself)."""
    states = (_arg(request, "state") or "running").split(",")
    wanted = metadata_filter(_arg(request, "metadata"))
    template = _arg(request, "template")
    after = _started_after(_arg(request, "startedAfter"))

    def passes(entry: E2BSandbox) -> bool:
        return (
            "running" in states
            and all(entry.metadata.get(k) == v for k, v in wanted.items())
            and template in (None, "", entry.template)
            and (after is None or datetime.fromtimestamp(entry.started_at, UTC) >= after)
        )

    return passes


def listing(front: "E2BFront", request: IRequest) -> bytes:
    """``GET /v2/sandboxes``: the running sandboxes matching the query, newest first (as E2B;
    ``order=asc``: oldest first), a page at a time. ``x-next-token`` names the last sandbox
    of a page that has more after it (its create's serial): the next page goes on from
    there, whatever was created or killed meanwhile."""
    order = _arg(request, "order") or "desc"
    if order not in ("asc", "desc"):
        raise RestError(400, f"order: {order!r} is neither 'asc' nor 'desc'")
    try:
        after = int(_arg(request, "nextToken") or 0)
        limit = min(int(_arg(request, "limit") or LIST_LIMIT_MAX), LIST_LIMIT_MAX)
    except ValueError:
        raise RestError(400, "nextToken and limit: must be integers") from None
    passes = _filter(request)
    found = sorted(
        (entry for entry in front.registry.all() if passes(entry)),
        key=lambda e: e.serial,
        reverse=order == "desc",
    )
    if after:
        found = [e for e in found if (e.serial < after if order == "desc" else e.serial > after)]
    page = found[: max(limit, 1)]
    if len(page) < len(found):
        request.setHeader(b"x-next-token", str(page[-1].serial).encode())
    return _answer(request, 200, [detail_json(front, entry) for entry in page])
