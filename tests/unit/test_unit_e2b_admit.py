"""The E2B front's rule at the headers: the control plane by its key, envd by the access token
of the sandbox named (an unknown sandbox let through, for the front's own answer)."""

import json

from twisted.internet.task import Clock
from twisted.web.http_headers import Headers

from sandboxd.e2b import wire
from sandboxd.e2b.admit import admission
from sandboxd.e2b.registry import Registry
from sandboxd.http.guard import Admission


class Known(Registry):
    """A registry holding one sandbox ``s1`` whose access token is ``good``."""

    def __init__(self) -> None:
        super().__init__(manager=None, clock=Clock())  # type: ignore[arg-type]

    def holds(self, sandbox_id: str, token: str) -> bool | None:
        if sandbox_id != "s1":
            return None
        return token == "good"


def headers(**values: str) -> Headers:
    return Headers({k.replace("_", "-").encode(): [v.encode()] for k, v in values.items()})


def test_the_control_plane_needs_the_key() -> None:
    admit = admission(b"key", Known())
    assert admit(b"/v2/sandboxes", None, headers(x_api_key="key")) is Admission.TRUSTED
    assert admit(b"/v2/sandboxes?limit=1", None, headers(x_api_key="nope")) is Admission.REFUSED
    assert admit(b"/sandboxes/s1", None, Headers()) is Admission.REFUSED
    assert admission(None, Known())(b"/v2/sandboxes", None, Headers()) is Admission.TRUSTED


def test_envd_needs_the_named_sandboxs_token() -> None:
    admit = admission(b"key", Known())
    for path in (b"/files?path=x", b"/health", b"/process.Process/Start"):
        named = headers(e2b_sandbox_id="s1", x_access_token="good")
        assert admit(path, None, named) is Admission.TRUSTED
        wrong = headers(e2b_sandbox_id="s1", x_access_token="bad")
        assert admit(path, None, wrong) is Admission.REFUSED
        assert admit(path, None, headers(e2b_sandbox_id="s1")) is Admission.REFUSED
        unknown = headers(e2b_sandbox_id="gone", x_access_token="x")
        assert admit(path, None, unknown) is Admission.OPEN


def test_the_refusal_is_in_the_shape_the_sdk_reads() -> None:
    rpc = wire.refused_answer(b"/filesystem.Filesystem/Stat")
    head, body = rpc.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and b"connection: close" in head
    assert json.loads(body)["code"] == "unauthenticated"
    rest = wire.refused_answer(b"/v2/sandboxes")
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["code"] == 401
    assert b"content-length: %d" % len(body) in head
