"""The E2B code interpreter on the E2B front (docs/e2b.rst, "Code interpreter").

What ``e2b-code-interpreter`` sends to its port 49999 (``POST /execute``, ``/contexts``...)
reaches this front when ``E2B_SANDBOX_URL`` points at it; such a call is told apart by its
``E2b-Sandbox-Port: 49999`` header and authorised by the sandbox's access token, sent as
``X-Access-Token`` (``/execute``), or by its traffic token, ``E2B-Traffic-Access-Token``
(every call: a create answers it as ``trafficAccessToken``). Each call is the core's
contexts (:mod:`sandboxd.core.contexts.service`); a context sees the workspace as its home
(``/home/user`` under a mount namespace).
"""

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from twisted.web.iweb import IRequest

from sandboxd.core import Context, context_events
from sandboxd.e2b import wire
from sandboxd.e2b.registry import E2BSandbox
from sandboxd.e2b.wire import RestError
from sandboxd.errors import ContextNotFound
from sandboxd.web.follow import FollowStream

if TYPE_CHECKING:
    from sandboxd.e2b.api import E2BFront

PORT = b"49999"
"""The port the SDK names for its interpreter (``E2b-Sandbox-Port``)."""
TEMPLATE = "code-interpreter-v1"
"""The template name the SDK creates its sandboxes from."""
TEMPLATES = (TEMPLATE, "code-interpreter")
"""The replica's templates a create of :data:`TEMPLATE` runs in, the first it has: one built
under E2B's name, else one under the built-in recipe's (docs/extensions.rst, "Built-in
recipes"). A template is never replaced, so no alias is kept: the name is looked up."""
PATHS = (b"/execute", b"/contexts")


def is_interpreter_call(path: bytes, port: bytes | None) -> bool:
    """Whether a request is the code interpreter's (its path and its port header)."""
    return port == PORT and path.split(b"?", 1)[0].startswith(PATHS)


def tokens_of(header: Callable[[bytes], bytes | None]) -> tuple[str | None, str | None]:
    """The tokens a call carries, read by ``header``: the sandbox's access token
    (``X-Access-Token``, on ``/execute``) and its traffic token (``E2B-Traffic-Access-Token``,
    on every call)."""

    def text(name: bytes) -> str | None:
        raw = header(name)
        return None if raw is None else raw.decode("utf-8", "replace")

    return text(b"x-access-token"), text(b"e2b-traffic-access-token")


def _body(request: IRequest) -> dict[str, Any]:
    content = request.content
    content.seek(0)
    raw = content.read()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise RestError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise RestError(400, "the body must be a JSON object")
    return body


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise RestError(400, f"{name}: must be a string")
    return value or None


def context_json(context: Context) -> dict[str, str]:
    return context.describe()


async def create_context(front: "E2BFront", request: IRequest, entry: E2BSandbox) -> bytes:
    body = _body(request)
    context = await front.manager.create_context(
        entry.sandbox, _text(body, "language"), _text(body, "cwd"), as_home=True
    )
    request.setHeader(b"content-type", wire.JSON)
    return wire.body(context_json(context))


def list_contexts(request: IRequest, entry: E2BSandbox) -> bytes:
    request.setHeader(b"content-type", wire.JSON)
    return wire.body([context_json(c) for c in entry.sandbox.contexts.values()])


async def restart_context(front: "E2BFront", entry: E2BSandbox, cid: str) -> bytes:
    manager = front.manager
    await manager.restart_context(entry.sandbox, manager.context(entry.sandbox, cid))
    return b""


async def remove_context(front: "E2BFront", entry: E2BSandbox, cid: str) -> bytes:
    manager = front.manager
    await manager.remove_context(entry.sandbox, manager.context(entry.sandbox, cid))
    return b""


async def _context_for(front: "E2BFront", entry: E2BSandbox, body: dict[str, Any]) -> Context:
    """The context an ``/execute`` names: ``context_id``, else ``language``'s default one
    (Python's without either), created on first use."""
    cid, language = _text(body, "context_id"), _text(body, "language")
    if cid is not None and language is not None:
        raise RestError(400, "context_id and language: give one of them, not both")
    sandbox = entry.sandbox
    if cid is not None:
        return front.manager.context(sandbox, cid)
    language = language or "python"
    default = entry.default_contexts.get(language)
    if default in sandbox.contexts:
        return sandbox.contexts[default]
    context = await front.manager.create_context(sandbox, language, None, as_home=True)
    entry.default_contexts[language] = context.cid
    return context


async def execute(front: "E2BFront", request: IRequest, entry: E2BSandbox) -> None:
    """The execution's lines, a keepalive during silence, ``end_of_execution`` last; the
    client's closing the connection interrupts it (the SDK's way)."""
    body = _body(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise RestError(400, "code: must be a string")
    env = body.get("env_vars") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise RestError(400, "env_vars: must be an object of strings")
    try:
        context = await _context_for(front, entry, body)
    except ContextNotFound as e:
        raise RestError(404, e.detail) from None
    manager = front.manager
    request.setHeader(b"content-type", b"application/x-ndjson")
    stream = FollowStream(request, manager.clock, manager.config.keepalive)
    stream.keepalive_frame = wire.INTERPRETER_KEEPALIVE

    def deliver(event: context_events.Event) -> None:
        now = datetime.fromtimestamp(manager.clock.seconds(), UTC).isoformat()
        stream.write(wire.interpreter_frame(event, now))
        if isinstance(event, context_events.End):
            stream.end()

    stream.start()
    execution = manager.run_code(entry.sandbox, context, code, env, deliver)
    try:
        await stream.wait()
    finally:
        execution.cancel()  # the client went: interrupt it (nothing once it has ended)
