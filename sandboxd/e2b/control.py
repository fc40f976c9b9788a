"""The E2B control plane: create, connect, get, list, kill and timeout of sandboxes.

A create makes a core sandbox (the same manager, isolation and limits as the native API) and
registers it with its own access token. The default template (``base``) is the host's root;
``code-interpreter-v1`` the replica's code-interpreter template where it has one, else the
host's root with the host's kernels (docs/e2b.rst, "Code interpreter"); any other is a
template of the replica's store, where its isolation can run sandboxes in one
(docs/e2b.rst, "Templates"); the features that have no meaning here (auto-pause, volumes,
MCP gateway) are refused, never ignored.
"""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from twisted.web.iweb import IRequest

from sandboxd.core import CreateRequest, TemplateRoot, parse_env
from sandboxd.e2b import interpreter, wire
from sandboxd.e2b.network import e2b_policy, network_json, update_network
from sandboxd.e2b.ports import public_traffic_of
from sandboxd.e2b.registry import TIMEOUT_DEFAULT, E2BSandbox
from sandboxd.e2b.wire import RestError
from sandboxd.errors import BadRequest, TemplateNotFound
from sandboxd.web.answers import answer

if TYPE_CHECKING:
    from sandboxd.e2b.api import E2BFront

TEMPLATES = ("base",)
REFUSED_FIELDS = ("autoPause", "autoResume", "mcp", "volumeMounts", "iam")
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


def internet_mode(front: "E2BFront", internet: bool | None) -> str:
    """The network mode for ``allow_internet_access`` (absent or null: ``true``, as in E2B;
    :func:`sandboxd.e2b.network.e2b_policy` has refused any other value).

    ``false`` is ``none`` (the sandbox's own loopback alone). ``true`` is ``egress`` where this
    replica offers and allows it, else ``host`` where that is the replica's default (no
    network namespaces: the sandbox has the host's network); otherwise a ``400`` naming why
    egress is missing and the setting, never a sandbox with its loopback alone
    (docs/e2b.rst, "Networking")."""
    if internet is False:
        return "none"
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
    return answer(request, status, wire.body(value))


def template_root(front: "E2BFront", name: object) -> TemplateRoot:
    """The replica's template ``name`` (docs/e2b.rst, "Templates"), where sandboxes can run in
    templates; else ``400`` saying why (only ``base``, the host's root, is there)."""
    if front.templates is None or not front.manager.isolation.namespaces.switches_root:
        raise RestError(
            400,
            f"template {name!r}: this sandboxd has only the default template 'base' (it runs"
            " no sandbox in templates)",
        )
    if not isinstance(name, str):
        raise RestError(400, "templateID: must be a template's name")
    try:
        return front.templates.root(name)
    except TemplateNotFound as e:
        raise RestError(404, e.detail) from None


def interpreter_root(front: "E2BFront") -> TemplateRoot | None:
    """The template ``code-interpreter-v1`` runs in (docs/e2b.rst, "Code interpreter"): the
    first of :data:`~sandboxd.e2b.interpreter.TEMPLATES` the replica has, where it can run
    sandboxes in templates; ``None`` where there is none (the host's root, its python3 and
    ipykernel, as before templates)."""
    if front.templates is None or not front.manager.isolation.namespaces.switches_root:
        return None
    for name in interpreter.TEMPLATES:
        try:
            return front.templates.root(name)
        except TemplateNotFound:
            continue
    return None


async def create(front: "E2BFront", request: IRequest) -> bytes:
    body = _json_body(request)
    template = body.get("templateID", "base")
    if template == interpreter.TEMPLATE:
        root = interpreter_root(front)
        missing = None if root is not None else await front.manager.contexts_missing()
        if missing is not None:
            raise RestError(400, f"template {template!r}: contexts are not available: {missing}")
    else:
        root = None if template in TEMPLATES else template_root(front, template)
    for name in REFUSED_FIELDS:
        if body.get(name):
            raise RestError(400, f"{name}: not supported by sandboxd")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise RestError(400, "metadata: must be an object of strings")
    public_traffic = public_traffic_of(body.get("network"))
    timeout = _timeout(body, TIMEOUT_DEFAULT)
    internet = body.get("allow_internet_access")
    egress = e2b_policy(body.get("network"), internet)  # (lists: the mode that reaches out)
    network = internet_mode(front, True if egress is not None else internet)
    try:
        env = parse_env(body.get("envVars"), "env")
        wanted = CreateRequest(env=env, network=network, egress=egress, template=root)
        sandbox = await front.manager.create_restored(wanted)
    except BadRequest as e:
        raise RestError(400, e.detail) from None
    entry = front.registry.add(sandbox, template, dict(metadata), timeout or TIMEOUT_DEFAULT)
    entry.public_traffic = public_traffic
    return _answer(request, 201, wire.sandbox_json(entry, front.manager.config.e2b_domain))


def connect(front: "E2BFront", request: IRequest, sandbox_id: str) -> bytes:
    entry = front.registry.get(sandbox_id)
    timeout = _timeout(_json_body(request), None)
    if timeout is not None:
        front.registry.extend(entry, timeout)
    return _answer(request, 200, wire.sandbox_json(entry, front.manager.config.e2b_domain))


def get_info(front: "E2BFront", request: IRequest, sandbox_id: str) -> bytes:
    entry = front.registry.get(sandbox_id)
    detail = wire.detail_json(front.manager.config, entry)
    shown = network_json(front.manager.egress_policy(entry.sandbox))
    if shown is not None:
        detail["network"] = shown
    return _answer(request, 200, detail)


def set_network(front: "E2BFront", request: IRequest, sandbox_id: str) -> bytes:
    update_network(front, front.registry.get(sandbox_id), _json_body(request))
    request.setResponseCode(204)
    return b""


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
    return _answer(request, 200, [wire.detail_json(front.manager.config, e) for e in page])
