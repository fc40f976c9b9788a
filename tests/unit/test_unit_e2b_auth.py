"""The E2B front's one authoriser (``sandboxd.e2b.admit.Authoriser``): what its routes ask of
it gives the verdict its rule at the headers gives, for the control plane's key, envd's access
token and a ``/files`` URL's signature; the routes also judge the operation and expiration."""

from typing import Any, cast
from urllib.parse import parse_qsl, urlencode

import pytest
from twisted.internet.task import Clock
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest
from twisted.web.test.requesthelper import DummyRequest

from sandboxd.e2b import signing
from sandboxd.e2b.admit import Authoriser, refusal
from sandboxd.e2b.registry import Registry
from sandboxd.e2b.wire import ConnectError, RestError
from sandboxd.errors import SandboxNotFound
from sandboxd.web.guard import Admission


class Held:
    """The core sandbox of an E2B one: its id, and the end of its life (set by the registry)."""

    rid = "s1"
    lives_until = 0.0


class Manager:
    """The manager's part the registry reads: which sandboxes live, each call's activity."""

    sandboxes = {"s1": Held()}

    def get(self, rid: str) -> Held:
        return self.sandboxes[rid]


def authoriser(clock: Clock | None = None) -> Authoriser:
    """A front with the key ``key`` holding one sandbox ``s1`` whose access token is ``good``."""
    registry = Registry(manager=cast(Any, Manager()), clock=clock or Clock())
    registry.add(cast(Any, Held()), "base", {}, 60).token = "good"
    return Authoriser(b"key", registry)


def request(path: bytes, **values: str) -> tuple[IRequest, Headers]:
    """A request for ``path`` with the headers ``values`` (``x_api_key``: ``x-api-key``)."""
    route, _, query = path.partition(b"?")
    dummy = DummyRequest(route.split(b"/")[1:])
    dummy.args = {k: [v] for k, v in parse_qsl(query, keep_blank_values=True)}
    for name, value in values.items():
        dummy.requestHeaders.setRawHeaders(name.replace("_", "-").encode(), [value.encode()])
    return cast(IRequest, dummy), dummy.requestHeaders


KEYS: list[dict[str, str]] = [{}, {"x_api_key": "key"}, {"x_api_key": "nope"}, {"x_api_key": ""}]


@pytest.mark.parametrize("key", KEYS)
def test_the_control_plane_key_is_one_check(key: dict[str, str]) -> None:
    auth = authoriser()
    call, headers = request(b"/v2/sandboxes", **key)
    verdict = auth.admit(b"/v2/sandboxes", None, headers)
    try:
        auth.control_plane(call)
    except RestError as e:
        assert verdict is Admission.REFUSED
        assert (e.status, e.message) == (
            401,
            "Invalid API key: X-API-Key must be the daemon's token",
        )
    else:
        assert verdict is Admission.TRUSTED
    assert (verdict is Admission.TRUSTED) == (key.get("x_api_key") == "key")
    assert Authoriser(None, auth.registry).admit(b"/v2/sandboxes", None, headers) is (
        Admission.TRUSTED
    )
    Authoriser(None, auth.registry).control_plane(call)


ACCESS: list[dict[str, str]] = [
    {"e2b_sandbox_id": "s1", "x_access_token": "good"},
    {"e2b_sandbox_id": "s1", "x_access_token": "bad"},
    {"e2b_sandbox_id": "s1"},
    {"e2b_sandbox_id": "gone", "x_access_token": "good"},
]


@pytest.mark.parametrize("values", ACCESS)
def test_envds_access_token_is_one_check(values: dict[str, str]) -> None:
    auth = authoriser()
    call, headers = request(b"/health", **values)
    verdict = auth.admit(b"/health", None, headers)
    try:
        entry = auth.envd(call)
    except ConnectError as e:
        assert verdict is Admission.REFUSED
        assert e.code == "unauthenticated"
    except SandboxNotFound:
        assert verdict is Admission.ABSENT
    else:
        assert verdict is Admission.TRUSTED
        assert entry.id == "s1"
        assert auth.files(call, signing.READ) is entry  # no signature: the access token


def test_envd_needs_a_sandbox_named() -> None:
    call, _ = request(b"/health")
    with pytest.raises(ConnectError) as raised:
        authoriser().envd(call)
    assert (raised.value.code, raised.value.message) == (
        "invalid_argument",
        "the E2b-Sandbox-Id header is required",
    )


def signed(operation: str, token: str = "good", expiration: int | None = None) -> bytes:
    mark = signing.signature("/home/user/f", operation, "user", token, expiration)
    fields = {"path": "/home/user/f", "username": "user", "signature": mark}
    if expiration is not None:
        fields["signature_expiration"] = str(expiration)
    return f"/files?{urlencode(fields)}".encode()


def test_a_signed_url_is_one_check_and_the_route_judges_its_operation() -> None:
    clock = Clock()
    clock.advance(100)
    auth = authoriser(clock)
    for operation, other in ((signing.READ, signing.WRITE), (signing.WRITE, signing.READ)):
        call, headers = request(signed(operation))
        assert auth.admit(signed(operation), None, headers) is Admission.OPEN
        assert auth.files(call, operation).id == "s1"
        with pytest.raises(RestError) as raised:
            auth.files(call, other)
        assert (raised.value.status, raised.value.message) == (401, "invalid signature")
    forged, headers = request(signed(signing.READ, token="guess"))
    assert auth.admit(signed(signing.READ, token="guess"), None, headers) is Admission.REFUSED
    with pytest.raises(RestError):
        auth.files(forged, signing.READ)
    expired, headers = request(signed(signing.READ, expiration=99))
    assert auth.admit(signed(signing.READ, expiration=99), None, headers) is Admission.OPEN
    with pytest.raises(RestError) as raised:
        auth.files(expired, signing.READ)
    assert raised.value.message == "signature is already expired"
    assert auth.files(request(signed(signing.READ, expiration=100))[0], signing.READ).id == "s1"
    with_token, _ = request(
        signed(signing.READ, token="guess"), x_access_token="good", e2b_sandbox_id="s1"
    )
    assert auth.files(with_token, signing.READ).id == "s1"  # the token wins over the URL


def test_the_refusal_at_the_headers_is_the_gates() -> None:
    auth = authoriser()
    for path in (b"/v2/sandboxes", b"/health", b"/process.Process/Start", signed(signing.READ)):
        for verdict in (Admission.REFUSED, Admission.ABSENT):
            named = Headers({b"e2b-sandbox-id": [b"gone"]})
            assert auth.refusal(path, verdict, named) == refusal(path, verdict, named)
