"""The E2B front's rule at the headers: the control plane by its key, envd by the access token
of the sandbox named, a signed URL by its signature; a sandbox the front does not hold is
answered at once, as its route would answer it."""

import json
from urllib.parse import urlencode

from twisted.internet.task import Clock
from twisted.web.http_headers import Headers

from sandboxd.e2b import signing, wire
from sandboxd.e2b.admit import admission, refusal
from sandboxd.e2b.registry import Registry
from sandboxd.web.guard import Admission

REFUSED = Admission.REFUSED


class Held:
    """The core sandbox of an E2B one: its id, and the end of its life (set by the registry)."""

    rid = "s1"
    lives_until = 0.0


def known() -> Registry:
    """A registry holding one sandbox ``s1`` whose access token is ``good``."""
    registry = Registry(manager=None, clock=Clock())  # type: ignore[arg-type]
    registry.add(Held(), "base", {}, 60).token = "good"  # type: ignore[arg-type]
    return registry


def headers(**values: str) -> Headers:
    return Headers({k.replace("_", "-").encode(): [v.encode()] for k, v in values.items()})


def test_the_control_plane_needs_the_key() -> None:
    admit = admission(b"key", known())
    assert admit(b"/v2/sandboxes", None, headers(x_api_key="key")) is Admission.TRUSTED
    assert admit(b"/v2/sandboxes?limit=1", None, headers(x_api_key="nope")) is Admission.REFUSED
    assert admit(b"/sandboxes/s1", None, Headers()) is Admission.REFUSED
    assert admission(None, known())(b"/v2/sandboxes", None, Headers()) is Admission.TRUSTED


def test_envd_needs_the_named_sandboxs_token() -> None:
    admit = admission(b"key", known())
    for path in (b"/files?path=x", b"/health", b"/process.Process/Start"):
        named = headers(e2b_sandbox_id="s1", x_access_token="good")
        assert admit(path, None, named) is Admission.TRUSTED
        wrong = headers(e2b_sandbox_id="s1", x_access_token="bad")
        assert admit(path, None, wrong) is Admission.REFUSED
        assert admit(path, None, headers(e2b_sandbox_id="s1")) is Admission.REFUSED
        unknown = headers(e2b_sandbox_id="gone", x_access_token="x")
        assert admit(path, None, unknown) is Admission.ABSENT
        assert admit(path, None, Headers()) is Admission.ABSENT


def test_the_refusal_is_in_the_shape_the_sdk_reads() -> None:
    rpc = wire.refused_answer(b"/filesystem.Filesystem/Stat")
    head, body = rpc.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and b"connection: close" in head
    assert json.loads(body)["code"] == "unauthenticated"
    rest = wire.refused_answer(b"/v2/sandboxes")
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["code"] == 401
    assert b"content-length: %d" % len(body) in head


def signed(operation: str, token: str = "good", expiration: str = "") -> bytes:
    path = "/home/user/f"
    stamp = int(expiration) if expiration else None
    mark = signing.signature(path, operation, "user", token, stamp)
    fields = {"path": path, "username": "user", "signature": mark}
    if expiration:
        fields["signature_expiration"] = expiration
    return f"/files?{urlencode(fields)}".encode()


def test_a_signed_url_is_judged_at_the_headers() -> None:
    admit = admission(b"key", known())
    for operation in (signing.READ, signing.WRITE):
        assert admit(signed(operation), None, Headers()) is Admission.OPEN
        named = headers(e2b_sandbox_id="s1")
        assert admit(signed(operation, expiration="12"), None, named) is Admission.OPEN
        forged = signed(operation, token="guess")
        assert admit(forged, None, Headers()) is Admission.REFUSED
        assert admit(forged, None, headers(e2b_sandbox_id="gone")) is Admission.ABSENT
    assert admit(b"/files?path=x&signature=v1_x&signature_expiration=soon", None, Headers()) is (
        Admission.REFUSED
    )
    malformed = refusal(
        b"/files?path=x&signature=v1_x&signature_expiration=soon", REFUSED, Headers()
    )
    assert malformed.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    refused = refusal(signed("read", token="guess"), Admission.REFUSED, Headers())
    assert json.loads(refused.split(b"\r\n\r\n", 1)[1])["message"] == "invalid signature"


def answer_of(path: bytes, sandbox_id: str = "gone") -> tuple[bytes, bytes, bytes]:
    named = headers(e2b_sandbox_id=sandbox_id) if sandbox_id else Headers()
    whole = refusal(path, Admission.ABSENT, named)
    head, payload = whole.split(b"\r\n\r\n", 1)
    assert b"connection: close" in head and b"content-length: %d" % len(payload) in head
    status_line, content_type = head.split(b"\r\n")[:2]
    return status_line, content_type, payload


def test_an_absent_sandbox_is_answered_as_its_route_answers_it() -> None:
    message = "The sandbox gone was not found"
    status, kind, payload = answer_of(b"/process.Process/Start")
    assert (status, kind) == (b"HTTP/1.1 200 OK", b"content-type: application/connect+json")
    flags, length = wire.HEADER.unpack_from(payload)
    assert flags == wire.FLAG_END and length == len(payload) - wire.HEADER.size
    error = json.loads(payload[wire.HEADER.size :])["error"]
    assert error == {"code": "unavailable", "message": message}
    status, kind, payload = answer_of(b"/filesystem.Filesystem/Stat")
    assert status == b"HTTP/1.1 503 Service Unavailable"
    assert json.loads(payload) == {"code": "unavailable", "message": message}
    for path in (b"/files?path=x", b"/health"):
        status, kind, payload = answer_of(path)
        assert (status, kind) == (b"HTTP/1.1 502 Bad Gateway", b"content-type: application/json")
        assert json.loads(payload) == {"code": 502, "message": message}
    assert refusal(b"/health", Admission.REFUSED, Headers()).startswith(b"HTTP/1.1 401 ")
    status, kind, payload = answer_of(b"/health", sandbox_id="")
    assert status == b"HTTP/1.1 400 Bad Request"
    assert json.loads(payload) == {"code": 400, "message": "the E2b-Sandbox-Id header is required"}
    status, kind, payload = answer_of(b"/filesystem.Filesystem/Stat", sandbox_id="")
    assert status == b"HTTP/1.1 400 Bad Request"
    assert json.loads(payload)["code"] == "invalid_argument"
