"""``docs/openapi.yaml`` is the wire contract: checked against the code and a running daemon.

Every documented operation is served (a request to it is never a routing ``404``/``405``),
nothing undocumented is served (the Klein app's ``url_map`` is compared with the document),
and the answers of a live daemon (successes, errors, the NDJSON exec stream) match the
documented status codes, media types and schemas.
"""

import base64
import json
from typing import Any

import jsonschema
import pytest

from tests.security.live_daemon import (
    PENDING,
    PUBLIC,
    Reply,
    call,
    create,
    documented_operations,
    fill,
    load_openapi,
    served_operations,
)

SPEC = load_openapi()
ROUTING_ERRORS = ("NotFound", "MethodNotAllowed")


def test_the_document_is_valid_openapi_3_1() -> None:
    from openapi_spec_validator import validate

    assert SPEC["openapi"].startswith("3.1.")
    validate(SPEC)


def test_nothing_undocumented_is_served() -> None:
    undocumented = served_operations() - documented_operations(SPEC)
    assert not undocumented, f"served but not in docs/openapi.yaml: {sorted(undocumented)}"


def test_every_documented_operation_is_served() -> None:
    missing = documented_operations(SPEC) - served_operations()
    assert missing <= set(PENDING), f"in docs/openapi.yaml, not served: {sorted(missing)}"
    done = set(PENDING) & served_operations()
    assert not done, f"served now: remove from live_daemon.PENDING: {sorted(done)}"


@pytest.mark.parametrize(("method", "path"), sorted(documented_operations(SPEC)))
def test_every_documented_operation_answers_on_a_live_daemon(
    authed: Any, method: str, path: str
) -> None:
    """Without the token, each operation is ``401`` (routed, then refused, nothing done);
    the public ones answer."""
    reply = call(authed, method, fill(path, "0123456789abcdef"))
    if (method, path) in PENDING:
        assert reply.status == 404 and reply.error() == "NotFound", reply
        pytest.xfail(PENDING[(method, path)])
    if (method, path) in PUBLIC:
        assert reply.status in (200, 503), reply
    else:
        assert reply.status == 401, reply
        assert reply.error() == "Unauthorized"


def undocumented_requests() -> list[tuple[str, str]]:
    documented = documented_operations(SPEC)
    requests = [
        (method, path)
        for path in sorted({p for _, p in documented})
        for method in ("GET", "PUT", "POST", "DELETE", "PATCH")
        if (method, path) not in documented
    ]
    requests += [
        ("GET", "/"),
        ("GET", "/openapi.yaml"),
        ("GET", "/sandboxes/{rid}/nothing"),
        ("GET", "/sandboxes/{rid}/file/extra"),
        ("POST", "/sandboxes/{rid}/exec/more"),
        ("GET", "/admin"),
        ("GET", "/healthz/x"),
    ]
    return requests


@pytest.mark.parametrize(("method", "path"), undocumented_requests())
def test_an_undocumented_request_is_a_routing_error(
    authed: Any, token: str, method: str, path: str
) -> None:
    reply = call(authed, method, fill(path, "0123456789abcdef"), token=token)
    if (method, path) in PENDING:
        pytest.xfail(PENDING[(method, path)])
    assert reply.status in (404, 405), reply
    assert reply.error() in ROUTING_ERRORS


# The answers match the document


def operation(method: str, path: str) -> dict[str, Any]:
    item = SPEC["paths"][path]
    op = item[method.lower()]
    assert isinstance(op, dict)
    return op


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = SPEC
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def check(reply: Reply, method: str, path: str) -> None:
    """The reply's status is documented for the operation, so are its headers, its media type
    is the documented one, and a JSON body validates against the documented schema."""
    responses = operation(method, path)["responses"]
    assert str(reply.status) in responses, (method, path, reply)
    documented = resolve(responses[str(reply.status)])
    for name, header in documented.get("headers", {}).items():
        value = reply.headers.get(name)
        if header.get("required"):
            assert value is not None, (name, reply)
        if value is not None:
            validate(value, header["schema"])
    content = documented.get("content")
    if not content:
        assert reply.body == b"", reply
        return
    assert reply.content_type in content, (reply.content_type, list(content))
    schema = content[reply.content_type].get("schema")
    if reply.content_type == "application/json":
        validate(reply.json(), schema)
    elif reply.content_type == "application/x-ndjson":
        for line in reply.body.splitlines():
            validate(json.loads(line), schema)


def validate(instance: Any, schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator({**schema, "components": SPEC["components"]}).validate(instance)


def test_every_success_matches_the_document(authed: Any, token: str) -> None:
    def do(method: str, path: str, target: str, body: Any = None, raw: Any = None) -> Reply:
        reply = call(authed, method, target, body, raw=raw, token=token)
        check(reply, method, path)
        assert reply.status < 300, reply
        return reply

    do("GET", "/healthz", "/healthz")
    do("GET", "/readyz", "/readyz")
    created = do("POST", "/sandboxes", "/sandboxes", {"env": {"A": "1"}}).json()
    rid = created["remote_id"]
    assert created["pod_url"] == f"http://127.0.0.1:{authed.port}"
    s = f"/sandboxes/{rid}"
    do("GET", "/sandboxes", "/sandboxes")
    do("GET", "/sandboxes/{rid}/stats", f"{s}/stats")
    do("GET", "/metrics", "/metrics")
    do("PUT", "/sandboxes/{rid}/file", f"{s}/file?path=/d/a.txt", raw=b"abc")
    assert do("GET", "/sandboxes/{rid}/file", f"{s}/file?path=d/a.txt").body == b"abc"
    assert do("GET", "/sandboxes/{rid}/exists", f"{s}/exists?path=d").json() == {"exists": True}
    assert do("GET", "/sandboxes/{rid}/size", f"{s}/size?path=d/a.txt").json() == {"size": 3}
    assert do("GET", "/sandboxes/{rid}/size", f"{s}/size?path=nope").json() == {"size": None}
    assert do("GET", "/sandboxes/{rid}/disk-usage", f"{s}/disk-usage").json() == {"bytes": 3}
    (entry,) = do("GET", "/sandboxes/{rid}/walk", f"{s}/walk?root=/d").json()["entries"]
    assert entry["path"] == "/d/a.txt"
    do("POST", "/sandboxes/{rid}/mkdir", f"{s}/mkdir", {"path": "e/f"})
    do("POST", "/sandboxes/{rid}/rename", f"{s}/rename", {"src": "d/a.txt", "dst": "e/f/b"})
    do("DELETE", "/sandboxes/{rid}/file", f"{s}/file?path=e/f/b")
    do("DELETE", "/sandboxes/{rid}/dir", f"{s}/dir?path=e")
    do("POST", "/sandboxes/{rid}/mark-ready", f"{s}/mark-ready")
    assert do("GET", "/sandboxes/{rid}/ready", f"{s}/ready").json() == {"ready": True}
    do("POST", "/sandboxes/{rid}/persist", f"{s}/persist", {"delete": False})
    stream = do(
        "POST",
        "/sandboxes/{rid}/exec",
        f"{s}/exec",
        {"cmd": ["sh", "-c", "echo out; echo err >&2; exit 3"], "stdin": ""},
    )
    frames = [json.loads(line) for line in stream.body.splitlines()]
    last = frames[-1]
    assert last["exit"] == 3
    assert base64.b64decode(last["out"]) == b"out\n"
    assert base64.b64decode(last["err"]) == b"err\n"
    assert all(set(frame) == {"o"} for frame in frames[:-1])
    do("DELETE", "/sandboxes/{rid}", s)


def test_every_error_matches_the_document(authed: Any, token: str) -> None:
    rid = create(authed, token)
    s = f"/sandboxes/{rid}"
    gone = "/sandboxes/0123456789abcdef"
    cases: list[tuple[str, str, str, Any, int, str]] = [
        ("POST", "/sandboxes", "/sandboxes", {"env": []}, 400, "BadRequest"),
        ("POST", "/sandboxes", "/sandboxes", {"item_id": "../x"}, 400, "BadRequest"),
        ("DELETE", "/sandboxes/{rid}", gone, None, 404, "SandboxNotFound"),
        ("GET", "/sandboxes/{rid}/stats", f"{gone}/stats", None, 404, "SandboxNotFound"),
        ("POST", "/sandboxes/{rid}/exec", f"{s}/exec", {"cmd": []}, 400, "BadRequest"),
        (
            "POST",
            "/sandboxes/{rid}/exec",
            f"{gone}/exec",
            {"cmd": ["true"]},
            404,
            "SandboxNotFound",
        ),
        ("PUT", "/sandboxes/{rid}/file", f"{s}/file?path=..", b"x", 400, "BadRequest"),
        ("GET", "/sandboxes/{rid}/file", f"{s}/file?path=nope", None, 404, "FileNotFoundError"),
        ("DELETE", "/sandboxes/{rid}/file", f"{s}/file?path=nope", None, 404, "FileNotFoundError"),
        ("GET", "/sandboxes/{rid}/exists", f"{s}/exists?path=%00", None, 400, "BadRequest"),
        ("GET", "/sandboxes/{rid}/size", f"{s}/size", None, 400, "BadRequest"),
        ("GET", "/sandboxes/{rid}/walk", f"{s}/walk?root=%FF", None, 400, "BadRequest"),
        ("GET", "/sandboxes/{rid}/disk-usage", f"{gone}/disk-usage", None, 404, "SandboxNotFound"),
        ("POST", "/sandboxes/{rid}/mkdir", f"{s}/mkdir", {"path": 1}, 400, "BadRequest"),
        ("DELETE", "/sandboxes/{rid}/dir", f"{s}/dir?path=nope", None, 404, "FileNotFoundError"),
        (
            "POST",
            "/sandboxes/{rid}/rename",
            f"{s}/rename",
            {"src": "nope", "dst": "x"},
            404,
            "FileNotFoundError",
        ),
        ("POST", "/sandboxes/{rid}/mark-ready", f"{gone}/mark-ready", None, 404, "SandboxNotFound"),
        ("GET", "/sandboxes/{rid}/ready", f"{gone}/ready", None, 404, "SandboxNotFound"),
        ("POST", "/sandboxes/{rid}/persist", f"{s}/persist", {"delete": 1}, 400, "BadRequest"),
    ]
    for method, path, target, body, status, error in cases:
        raw = body if isinstance(body, bytes) else None
        json_body = None if raw is not None else body
        reply = call(authed, method, target, json_body, raw=raw, token=token)
        assert (reply.status, reply.error()) == (status, error), (method, target, reply)
        check(reply, method, path)
    for method, path in sorted(documented_operations(SPEC) - PUBLIC - set(PENDING)):
        reply = call(authed, method, fill(path, rid))
        assert reply.status == 401
        check(reply, method, path)
