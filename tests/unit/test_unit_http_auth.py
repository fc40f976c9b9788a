"""The native API's one bearer-token check (``sandboxd.http.auth.BearerAuthoriser``): the
channel's rule at the headers and the routes' check give the same verdict for every header,
and the early ``401`` is the route's own."""

from typing import cast

import pytest
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest
from twisted.web.test.requesthelper import DummyRequest

from sandboxd.http import wire
from sandboxd.http.auth import BearerAuthoriser
from sandboxd.http.wire import Unauthorized
from sandboxd.web.guard import Admission

HEADERS = [None, b"", b"Bearer t", b"Bearer x", b"bearer t", b"Bearer t ", b"Basic dDp0"]


def request_with(authorization: bytes | None) -> IRequest:
    request = DummyRequest([b"sandboxes"])
    if authorization is not None:
        request.requestHeaders.setRawHeaders(b"authorization", [authorization])
    return cast(IRequest, request)


@pytest.mark.parametrize("authorization", HEADERS)
def test_the_gate_and_the_routes_agree(authorization: bytes | None) -> None:
    authoriser = BearerAuthoriser(b"t")
    verdict = authoriser.admit(b"/sandboxes", authorization, Headers())
    try:
        authoriser.check(request_with(authorization))
    except Unauthorized as e:
        assert verdict is Admission.REFUSED
        assert e.args == (wire.UNAUTHORIZED_DETAIL,)
    else:
        assert verdict is Admission.TRUSTED
    assert (verdict is Admission.TRUSTED) == (authorization == b"Bearer t")


def test_without_a_token_everything_is_trusted() -> None:
    authoriser = BearerAuthoriser(None)
    for authorization in HEADERS:
        assert authoriser.admit(b"/sandboxes", authorization) is Admission.TRUSTED
        authoriser.check(request_with(authorization))


def test_open_paths_are_open_only_without_the_token() -> None:
    authoriser = BearerAuthoriser(b"t")
    assert authoriser.admit(b"/healthz", b"Bearer t") is Admission.TRUSTED
    assert authoriser.admit(b"/healthz", None) is Admission.OPEN
    assert authoriser.admit(b"/readyz?x", b"Bearer x") is Admission.OPEN
    assert authoriser.admit(b"/healthz/x", None) is Admission.REFUSED


def test_the_refusal_is_the_routes_401() -> None:
    answer = BearerAuthoriser(b"t").refusal(b"/sandboxes", Admission.REFUSED, Headers())
    assert answer == wire.unauthorized_answer()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    assert b"\r\nwww-authenticate: " + wire.BEARER_CHALLENGE in head
    assert body == wire.error_body("Unauthorized", wire.UNAUTHORIZED_DETAIL)
