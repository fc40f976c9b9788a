"""Request parsing of the HTTP front: query parameters, JSON bodies and their fields, the
``<rid>`` URL converter. Every refusal is a :class:`~sandboxd.errors.BadRequest` naming the
field (``400``), or :class:`~sandboxd.web.body.TooLarge` (``413``).
"""

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

from twisted.web.iweb import IRequest
from werkzeug.routing import BaseConverter

from sandboxd.core import (
    RECIPES,
    RESERVED_PREFIX,
    RID_PATTERN,
    SHA256_HEX,
    CreateRequest,
    ExecSpec,
    normalise,
    parse_env,
    recipe_names,
)
from sandboxd.errors import BadRequest
from sandboxd.isolation.network.egress_policy import EgressPolicy, parse_policy
from sandboxd.web.body import TooLarge
from sandboxd.web.body import refuse_too_large as refuse_too_large

JSON_BODY_LIMIT = 64 << 20
ITEM_ID_MAX = 255
MAX_TOOLS = 64


class RidConverter(BaseConverter):
    """``<rid:...>``: a sandbox id in the URL. Text that cannot be one becomes ``""``, an id no
    sandbox has (the route answers ``404 SandboxNotFound`` like any unknown id)."""

    def to_python(self, value: str) -> str:
        return value if RID_PATTERN.match(value) else ""


def query(request: IRequest, name: str, default: str | None = None) -> str:
    """One query parameter as text, ``400`` when missing or not UTF-8."""
    values = request.args.get(name.encode()) if request.args else None
    if not values:
        if default is not None:
            return default
        raise BadRequest(f"{name}: missing query parameter")
    try:
        return cast(bytes, values[0]).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{name}: not UTF-8") from None


def json_body(request: IRequest) -> dict[str, Any]:
    """The request's JSON object, ``400`` when it is not one (an absent body is ``{}``)."""
    refuse_too_large(request, JSON_BODY_LIMIT)
    raw = request.content.read(JSON_BODY_LIMIT + 1)  # a chunked body has no Content-Length
    if len(raw) > JSON_BODY_LIMIT:
        raise TooLarge(f"the request body is over {JSON_BODY_LIMIT} bytes")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("body: not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    refuse_lone_surrogates(body)
    return body


def refuse_lone_surrogates(body: dict[str, Any]) -> None:
    """``400`` naming the field whose text holds a lone surrogate (JSON ``"\\ud800"``).

    Such text has no UTF-8 form: it could be neither a path, nor an argument, nor an
    environment entry, and would fail later, deep inside the call, as a ``500``.
    """
    for key, value in body.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            name = key.encode("utf-8", "backslashreplace").decode()
            raise BadRequest(f"{name}: not valid Unicode (a lone surrogate)") from None


def check_item_id(item_id: object) -> str | None:
    """``item_id`` names one archive entry: no ``/``, no ``..``, no NUL, bounded length, and not
    the archive's own ``.sandboxd-`` names."""
    if item_id is None:
        return None
    if not isinstance(item_id, str) or not item_id:
        raise BadRequest("item_id: must be a non-empty string")
    try:
        size = len(item_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("item_id: not valid Unicode text") from None
    if "/" in item_id or "\0" in item_id or item_id in (".", "..") or size > ITEM_ID_MAX:
        raise BadRequest(
            f"item_id: one path component of at most {ITEM_ID_MAX} bytes, no '/' or NUL"
        )
    if item_id.startswith(RESERVED_PREFIX):
        raise BadRequest(f"item_id: names starting with {RESERVED_PREFIX!r} are reserved")
    return item_id


def create_request(body: dict[str, Any]) -> CreateRequest:
    """``POST /sandboxes``: the create-time ``env``, the ``item_id`` and the ``network`` mode's
    name (which modes this replica offers and allows is the core's to check)."""
    image = body.get("image")
    if image is not None and not isinstance(image, str):
        raise BadRequest("image: must be a string")
    ports = body.get("exposed_ports")
    if ports is not None and not (isinstance(ports, list) and all(type(p) is int for p in ports)):
        raise BadRequest("exposed_ports: must be a list of port numbers")
    item_id = check_item_id(body.get("item_id"))
    env = parse_env(body.get("env"), "env")
    network, egress = network_request(body.get("network"))
    return CreateRequest(env=env, item_id=item_id, network=network, egress=egress)


POLICY_FIELDS = ("allow_out", "deny_out", "rules", "socks5")
"""The fields of a ``network`` object that make an egress policy."""


def network_request(value: object) -> tuple[str | None, EgressPolicy | None]:
    """A create's ``network``: a mode's name, or ``{"mode": ..., "allow_out": [...],
    "deny_out": [...], "rules": {...}, "socks5": {...}}`` (docs/isolation.rst, "Egress policy
    per sandbox", "Header rules", "A sandbox's own SOCKS5 proxy"); an object with a list,
    rules or a proxy and no mode asks for ``egress``, the only mode that takes them."""
    if value is None or isinstance(value, str):
        return value, None
    if not isinstance(value, dict):
        raise BadRequest("network: must be a network mode's name or an object")
    unknown = sorted(set(value) - {"mode", *POLICY_FIELDS})
    if unknown:
        raise BadRequest(f"network: unknown field {unknown[0]!r}")
    mode = value.get("mode")
    if mode is not None and not isinstance(mode, str):
        raise BadRequest("network: mode must be a string naming a network mode")
    if all(value.get(name) is None for name in POLICY_FIELDS):
        return mode, None
    return mode or "egress", egress_policy(value)


def egress_policy(value: dict[str, Any]) -> EgressPolicy:
    """The ``allow_out`` and ``deny_out`` lists, the ``rules`` and the ``socks5`` proxy of a
    body (``400`` naming a bad entry, never a header's value or a password)."""
    try:
        return parse_policy(
            value.get("allow_out"), value.get("deny_out"), value.get("rules"), value.get("socks5")
        )
    except ValueError as e:
        raise BadRequest(f"network: {e}") from None


def network_update(body: dict[str, Any]) -> EgressPolicy:
    """``PUT /sandboxes/{rid}/network``: the sandbox's new ``allow_out``, ``deny_out`` and
    ``rules`` (absent: none; all absent: the policy that restricts nothing)."""
    unknown = sorted(set(body) - set(POLICY_FIELDS))
    if unknown:
        raise BadRequest(f"network: unknown field {unknown[0]!r}")
    return egress_policy(body)


def exec_spec(body: dict[str, Any]) -> ExecSpec:
    """The body of ``POST /sandboxes/{rid}/exec``; every problem is a ``400`` naming the field."""
    cmd = body.get("cmd")
    if not isinstance(cmd, list) or not cmd:
        raise BadRequest("cmd: must be a non-empty list of strings")
    for arg in cmd:
        if not isinstance(arg, str):
            raise BadRequest("cmd: must be a non-empty list of strings")
        if "\0" in arg:
            raise BadRequest("cmd: an argument contains a NUL byte")
    timeout = body.get("timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise BadRequest("timeout: must be a number of seconds")
        if not timeout > 0:
            raise BadRequest("timeout: must be above zero")
    cwd = body.get("cwd")
    return ExecSpec(
        cmd=tuple(cmd),
        env=parse_env(body.get("env"), "env"),
        cwd=normalise("/" if cwd is None else cwd, "cwd"),
        timeout=None if timeout is None else float(timeout),
        stdin=_stdin(body.get("stdin")),
        tools=_tools(body.get("tools")),
    )


def exec_split(body: dict[str, Any]) -> bool:
    """The ``split`` extension of ``exec``: ``true`` sends live stderr as ``{"e": …}`` frames."""
    split = body.get("split", False)
    if not isinstance(split, bool):
        raise BadRequest("split: must be true or false")
    return split


def _stdin(value: object) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest("stdin: must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("stdin: not valid base64") from None


def _tools(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest("tools: must be a list of sha256 strings")
    for sha in value:
        if not SHA256_HEX.match(sha):
            raise BadRequest(f"tools: {sha!r} is not a sha256")
    return tuple(value)


def tools_body(body: dict[str, Any]) -> dict[str, Any]:
    """``POST /tools/resolve``: the ``{name: manifest_url}`` wanted."""
    wanted = body.get("tools")
    if not isinstance(wanted, dict):
        raise BadRequest("tools: must be an object of name → manifest URL")
    if len(wanted) > MAX_TOOLS:
        raise BadRequest(f"tools: at most {MAX_TOOLS} per request")
    return wanted


def persist_body(body: dict[str, Any]) -> bool:
    """``POST persist``: ``delete``, a boolean (absent: false)."""
    delete = body.get("delete", False)
    if not isinstance(delete, bool):
        raise BadRequest("delete: must be true or false")
    return delete


def process_start_body(body: dict[str, Any]) -> tuple[ExecSpec, str | None, bool]:
    """``POST processes``: the command (as ``exec`` takes it, but ``stdin`` is a boolean:
    keep a pipe open), and its ``tag``."""
    stdin = body.get("stdin", False)
    if not isinstance(stdin, bool):
        raise BadRequest("stdin: must be true or false")
    tag = body.get("tag")
    if tag is not None and (not isinstance(tag, str) or len(tag) > TAG_MAX or "\0" in tag):
        raise BadRequest(f"tag: must be a string of at most {TAG_MAX} characters")
    spec = exec_spec({k: v for k, v in body.items() if k not in ("stdin", "tag", "split")})
    return spec, tag, stdin


TAG_MAX = 256


def flag(request: IRequest, name: str, default: bool) -> bool:
    """A boolean query parameter: ``true``/``1`` or ``false``/``0``."""
    text = query(request, name, "true" if default else "false").lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise BadRequest(f"{name}: must be true or false")


def offset_param(request: IRequest) -> int:
    """``offset``: a byte offset, 0 or more (absent: 0)."""
    text = query(request, "offset", "0")
    if not text.isascii() or not text.isdigit() or len(text) > 20:
        raise BadRequest("offset: must be a byte offset (0 or more)")
    return int(text)


def signal_body(body: dict[str, Any], names: Iterable[str]) -> str:
    """``POST signal``: one of the signal ``names``."""
    name = body.get("signal")
    allowed = sorted(names)
    if not isinstance(name, str) or name not in allowed:
        raise BadRequest(f"signal: must be one of {', '.join(allowed)}")
    return name


# Ports (docs/extensions.rst, "Ports")


def port_public(body: dict[str, Any]) -> bool | None:
    """``POST /sandboxes/{rid}/ports/{port}``: ``public``, a boolean (absent: unchanged)."""
    public = body.get("public")
    if public is not None and not isinstance(public, bool):
        raise BadRequest("public: must be true or false")
    return public


# Contexts (docs/extensions.rst, "Contexts")


def _optional_text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or not value or "\0" in value):
        raise BadRequest(f"{name}: must be a non-empty string")
    return value


def context_create_body(body: dict[str, Any]) -> tuple[str | None, str | None]:
    """``POST contexts``: its ``language`` and ``cwd`` (each optional)."""
    return _optional_text(body, "language"), _optional_text(body, "cwd")


def run_code_body(body: dict[str, Any]) -> tuple[str, dict[str, str], float | None]:
    """``POST contexts/{cid}/run``: ``code``, ``env`` for this execution, ``timeout`` seconds."""
    code = body.get("code")
    if not isinstance(code, str):
        raise BadRequest("code: must be a string")
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise BadRequest("timeout: must be a positive number of seconds")
    return code, parse_env(body.get("env"), "env"), timeout


def with_recipe(body: Mapping[str, Any]) -> dict[str, Any]:
    """A build's JSON ``body`` with its ``recipe`` (if any) made into the ``dockerfile`` and
    ``network`` it stands for (a ``network`` the body gives wins). ``400`` for a recipe that
    is not one of :data:`RECIPES`, or one given with a ``dockerfile``."""
    name = body.get("recipe")
    if name is None:
        return dict(body)
    recipe = RECIPES.get(name) if isinstance(name, str) else None
    if recipe is None:
        raise BadRequest(
            f"recipe: {name!r} is not a recipe of this daemon (recipes: {recipe_names()})"
        )
    if "dockerfile" in body:
        raise BadRequest("recipe and dockerfile: give one of them, not both")
    return {"network": recipe.network, **body, "dockerfile": recipe.dockerfile}
