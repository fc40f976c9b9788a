"""Header rules without a kernel: what a request's ``rules`` may hold, which rule a name gets,
what listings show (never a value), the request rewriter's parse of a connection's requests
(heads, bodies by length and by chunks, keep-alive, everything it refuses), and the proxy's
course for a name with a rule on Twisted's memory transports. The real thing, with a real
sandbox and upstream: ``tests/kernel/test_egress_rules.py``."""

from typing import Any

import pytest
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from sandboxd.errors import BadRequest
from sandboxd.http.parse import network_request, network_update
from sandboxd.isolation.network.egress_policy import EgressPolicy, parse_policy
from sandboxd.isolation.network.egress_rewrite import (
    HEAD_MAX,
    LINE_MAX,
    Refused,
    RequestRewriter,
)
from sandboxd.isolation.network.egress_rules import (
    HEADERS_MAX,
    RULES_MAX,
    VALUE_MAX,
    HeaderRule,
    parse_rules,
    rule_for,
    rules_json,
)
from tests.isolation.test_isolation_egress_names import client_hello
from tests.isolation.test_isolation_egress_proxy import connect, proxy_for

SECRET = "Bearer s3cr3t-t0ken"
RULES = {"api.example.com": [{"headers": {"Authorization": SECRET}}]}


def test_rules_parse_merge_in_order_and_never_show_a_value() -> None:
    rules = parse_rules(
        {
            "API.example.com": [
                {"headers": {"Authorization": "old", "X-Team": "t"}},
                {"headers": {"authorization": SECRET}},
                {},
            ],
            "*.example.com": [{"headers": {"X-Any": "1"}}],
        }
    )
    assert rules[0] == HeaderRule("api.example.com", (("authorization", SECRET), ("X-Team", "t")))
    assert rules_json(rules) == {
        "api.example.com": ["authorization", "X-Team"],
        "*.example.com": ["X-Any"],
    }
    assert SECRET not in repr(rules) and "X-Team" in repr(rules)
    policy = parse_policy(None, None, RULES)
    assert policy.by_name and not policy.empty
    assert policy.to_json() == {
        "allow_out": None,
        "deny_out": [],
        "rules": {"api.example.com": ["Authorization"]},
    }
    assert SECRET not in repr(policy) and SECRET not in str(policy.to_json())
    assert parse_policy(None, None, None).rules == ()


def test_the_exact_rule_wins_then_the_longest_wildcard() -> None:
    rules = parse_rules(
        {
            "*.example.com": [{"headers": {"X-Rule": "wide"}}],
            "*.api.example.com": [{"headers": {"X-Rule": "narrow"}}],
            "api.example.com": [{"headers": {"X-Rule": "exact"}}],
        }
    )

    def chosen(name: str) -> str | None:
        rule = rule_for(rules, name)
        return None if rule is None else rule.headers[0][1]

    assert chosen("api.example.com") == "exact"
    assert chosen("v1.api.example.com") == "narrow"
    assert chosen("www.example.com") == "wide"
    assert chosen("example.com") is None and chosen("other.example") is None


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([], "must be an object"),
        ({f"h{i}.example": [] for i in range(RULES_MAX + 1)}, "hosts, at most"),
        ({"10.0.0.1": []}, "is not a host name"),
        ({"a.example": {}}, "must be a list of rules"),
        ({"a.example": ["x"]}, "a rule is"),
        ({"a.example": [{"transform": {}}]}, "a rule is"),
        ({"a.example": [{"headers": []}]}, "headers must be an object"),
        ({"a.example": [{"headers": {"Bad Name": "v"}}]}, "is not a header name"),
        ({"a.example": [{"headers": {"Host": "b.example"}}]}, "Host cannot be set"),
        ({"a.example": [{"headers": {"Content-Length": "0"}}]}, "cannot be set"),
        ({"a.example": [{"headers": {"X": "a\r\nHost: b"}}]}, "without CR, LF"),
        ({"a.example": [{"headers": {"X": "a\0"}}]}, "without CR, LF"),
        ({"a.example": [{"headers": {"X": 1}}]}, "must be a string"),
        ({"a.example": [{"headers": {"X": "v" * (VALUE_MAX + 1)}}]}, "at most"),
        (
            {"a.example": [{"headers": {f"X-{i}": "v" for i in range(HEADERS_MAX + 1)}}]},
            "headers, at most",
        ),
        (
            {f"h{i}.example": [{"headers": {"X": "v" * VALUE_MAX}}] for i in range(9)},
            "bytes of headers, at most",
        ),
    ],
)
def test_bad_rules_are_refused_naming_them_never_their_value(rules: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        parse_rules(rules)
    assert "Host: b" not in str(raised.value)


def test_the_native_network_body_takes_rules() -> None:
    mode, policy = network_request({"rules": RULES})
    assert mode == "egress" and policy is not None and policy.rules[0].pattern == "api.example.com"
    assert network_update({"allow_out": ["api.example.com"], "rules": RULES}).rules
    with pytest.raises(BadRequest, match=r"network: rules\.a\.example: a rule is"):
        network_request({"mode": "egress", "rules": {"a.example": [{"x": 1}]}})
    assert network_request({"mode": "egress", "rules": None}) == ("egress", None)


HEADERS = (("Authorization", SECRET),)


def rewritten(*pieces: bytes, name: str = "api.example.com") -> bytes:
    """What goes upstream for ``pieces`` fed one by one."""
    rewriter = RequestRewriter(name, HEADERS)
    return b"".join(rewriter.feed(piece) for piece in pieces)


def test_each_request_of_a_kept_alive_connection_gets_the_headers() -> None:
    first = b"GET /a HTTP/1.1\r\nHost: api.example.com\r\nauthorization: mine\r\n\r\n"
    second = b"POST /b HTTP/1.1\r\nHost: API.example.com:80\r\nContent-Length: 5\r\n\r\nhello"
    third = (
        b"PUT /c HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    fourth = b"OPTIONS * HTTP/1.0\r\nHost: api.example.com\r\nContent-Length: 0\r\n\r\n"
    whole = first + second + third + fourth
    out = rewritten(whole)
    assert rewritten(*(whole[i : i + 1] for i in range(len(whole)))) == out  # byte by byte
    auth = f"Authorization: {SECRET}\r\n".encode()
    assert out == (
        b"GET /a HTTP/1.1\r\nHost: api.example.com\r\n" + auth + b"\r\n"
        b"POST /b HTTP/1.1\r\nHost: API.example.com:80\r\nContent-Length: 5\r\n"
        + auth
        + b"\r\nhello"
        b"PUT /c HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n"
        + auth
        + b"\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n"
        b"OPTIONS * HTTP/1.0\r\nHost: api.example.com\r\nContent-Length: 0\r\n" + auth + b"\r\n"
    )
    assert b"mine" not in out


def test_a_body_passes_as_it_comes_without_being_held() -> None:
    rewriter = RequestRewriter("api.example.com", HEADERS)
    body = b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n" * 2000  # only bytes of a body
    head = f"POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: {len(body)}\r\n\r\n"
    assert rewriter.feed(head.encode()).endswith(b"\r\n\r\n")
    assert rewriter.feed(body[:50000]) == body[:50000] and not rewriter.buffer
    assert rewriter.feed(body[50000:]) == body[50000:]
    with pytest.raises(Refused, match="host_changed"):
        rewriter.feed(b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n")


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n", "host_changed"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: api.example.com\r\n\r\n", "host_changed"),
        (b"GET / HTTP/1.1\r\n\r\n", "host_changed"),
        (b"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n", "host_changed"),
        (b"GET / HTTP/1.1\r\nHost: bad..name\r\n\r\n", "host_changed"),
        (b"GET http://other.example/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", "malformed"),
        (b"CONNECT other.example:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n", "malformed"),
        (b"GET * HTTP/1.1\r\nHost: api.example.com\r\n\r\n", "malformed"),
        (b"GET / HTTP/2.0\r\nHost: api.example.com\r\n\r\n", "malformed"),
        (b"GET /\r\nHost: api.example.com\r\n\r\n", "malformed"),
        (b"G(T / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", "malformed"),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\nHost: other.example\r\n\r\n", "malformed"),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\rX: y\r\n\r\n", "malformed"),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\r\nX: \0\r\n\r\n", "malformed"),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\r\n folded\r\n\r\n", "malformed"),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\r\nno colon\r\n\r\n", "malformed"),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\r\nUpgrade: websocket\r\n\r\n", "upgrade"),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            "malformed",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "malformed",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 1, 2\r\n\r\n",
            "malformed",
        ),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: -1\r\n\r\n", "malformed"),
        (
            b"POST / HTTP/1.0\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n",
            "malformed",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "malformed",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"1\r\nab\r\n",
            "malformed",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n1\n\r\n",
            "malformed",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"1" * (LINE_MAX + 1),
            "malformed",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n" + b"X: y\r\n" * (HEAD_MAX // 6 + 1),
            "head_too_large",
        ),
        (b"GET / HTTP/1.1\r\nHost: api.example.com\r\nX: " + b"y" * HEAD_MAX, "head_too_large"),
        (
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nX: " + b"y" * HEAD_MAX + b"\r\n\r\n",
            "head_too_large",
        ),
    ],
)
def test_what_could_be_read_otherwise_upstream_is_refused(sent: bytes, reason: str) -> None:
    with pytest.raises(Refused) as refused:
        rewritten(sent)
    assert refused.value.reason == reason


def test_the_proxy_refuses_a_rule_over_tls() -> None:
    assert parse_rules({"good.example": [], "b.example": [{"headers": {}}]}) == ()
    proxy, reactor = proxy_for(
        parse_policy(["good.example"], None, {"good.example": [{"headers": {"X": "1"}}]})
    )
    side, transport = connect(proxy)
    side.dataReceived(client_hello("good.example"))
    assert transport.aborted and not reactor.tcpClients
    assert proxy.refused == {("a", "rule_over_tls"): 1}


class Upstream(StringTransport):
    """The upstream's connection as Twisted gives it."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: Any = None
        self.write_closed = False
        self.aborted = False

    def loseWriteConnection(self) -> None:
        self.write_closed = True

    def abortConnection(self) -> None:
        self.aborted = True


def rule_connection(
    policy: EgressPolicy, first: bytes, ended: bool = False, answered: bytes = b"answered"
) -> tuple[Any, Any, Upstream, Any]:
    proxy, _reactor = proxy_for(policy)
    side, transport = connect(proxy)
    side.dataReceived(first)
    if ended:
        side.readConnectionLost()
    upstream = Upstream()
    side.relay_to(upstream, answered)
    return proxy, side, upstream, transport


RULED = parse_policy(["good.example"], None, {"good.example": [{"headers": {"X-Key": SECRET}}]})
GET = b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n"


def test_the_proxy_rewrites_each_request_and_passes_the_answers() -> None:
    proxy, side, upstream, transport = rule_connection(RULED, GET)
    key = f"X-Key: {SECRET}\r\n".encode()
    assert upstream.value() == GET[:-2] + key + b"\r\n"
    assert transport.value() == b"answered" and transport.producerState == "producing"
    assert side.relay is None and proxy.open["a"] == 1
    side.dataReceived(GET)
    assert upstream.value().count(key) == 2
    upstream.protocol.dataReceived(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.value() == b"answered" + b"HTTP/1.1 200 OK\r\n\r\n"
    side.readConnectionLost()
    assert upstream.write_closed
    upstream.protocol.writeConnectionLost()
    upstream.protocol.readConnectionLost()
    assert transport.write_closed
    upstream.protocol.connectionLost(None)
    assert transport.disconnecting
    side.connectionLost(None)
    assert upstream.disconnecting and not proxy.open and not proxy.refused


def test_the_proxy_resets_a_connection_that_sends_a_second_host() -> None:
    proxy, side, upstream, transport = rule_connection(RULED, GET)
    side.dataReceived(b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n")
    assert transport.aborted and upstream.aborted
    assert proxy.refused == {("a", "host_changed"): 1}
    side.dataReceived(GET)  # (read before the reset took hold): nothing more goes up
    side.readConnectionLost()
    assert upstream.value().count(b"X-Key") == 1 and not upstream.write_closed


def test_a_reset_of_either_side_resets_the_other() -> None:
    _, side, upstream, transport = rule_connection(RULED, GET)
    upstream.protocol.connectionLost(Failure(ConnectionDone()))
    assert transport.disconnecting and not transport.aborted
    upstream.protocol.connectionLost(Failure(ConnectionLost()))
    assert transport.aborted
    side.connectionLost(Failure(ConnectionLost()))
    assert upstream.aborted


def test_a_sandbox_that_ended_before_the_upstream_was_up() -> None:
    _, _, upstream, transport = rule_connection(RULED, GET, ended=True)
    assert upstream.write_closed and upstream.value().endswith(b"\r\n\r\n")
    _, _, upstream, transport = rule_connection(RULED, GET + b"\0\0\0 bad\r\n\r\n", True)
    assert upstream.aborted and transport.aborted and not upstream.write_closed
    _, _, upstream, transport = rule_connection(RULED, GET + b"\0\r\n\r\n", answered=b"")
    assert upstream.aborted and transport.value() == b"" and transport.producerState == "paused"
