"""Handles, the error mapping and the retry policy, without a network."""

from __future__ import annotations

import base64
import errno
import gc
import json
from typing import Any

import pytest
from hyperlink import DecodedURL
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import error as ierror
from twisted.internet.abstract import FileDescriptor
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred, fail, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web._newclient import (
    RequestGenerationFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
    TransportProxyProducer,
)
from twisted.web.client import FileBodyProducer
from twisted.web.iweb import UNKNOWN_LENGTH

from sandboxd_client import (
    NetworkInfo,
    ProtocolError,
    RetryPolicy,
    SandboxBusy,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
    SandboxUnavailable,
    Socks5,
    Socks5TLS,
    TooLarge,
    decode_handle,
    encode_handle,
)
from sandboxd_client import _body as body
from sandboxd_client import _wire as wire
from sandboxd_client._base import sandbox_url
from sandboxd_client._body import read_body
from sandboxd_client._errors import (
    error_for,
    error_from_frame,
    error_from_response,
    error_from_transport,
)
from sandboxd_client._handles import check_base_url
from sandboxd_client._literal_hosts import literal_uri, standin_url
from sandboxd_client._retry import retrying
from sandboxd_client._transport import Transport, collector_paused
from sandboxd_client._types import WalkEntry
from sandboxd_client._wire import decode_created, decode_health, decode_walk, exec_body

# -- handles -------------------------------------------------------------------------------

rids = st.text(min_size=1, max_size=40).filter(
    lambda r: (
        r not in (".", "..") and "/" not in r and all(ord(c) >= 0x20 and c != "\x7f" for c in r)
    )
)
pod_urls = st.sampled_from(
    ["http://10.1.2.3:8080", "https://pod-1.sandboxd.svc:8443/", "http://[fd00::5]:9/prefix"]
)


@settings(max_examples=50, deadline=None)
@given(pod_url=pod_urls, rid=rids)
def test_handles_round_trip(pod_url: str, rid: str) -> None:
    handle = encode_handle(pod_url, rid)
    route = decode_handle(handle)
    assert route.remote_id == rid
    expected = DecodedURL.from_text(pod_url)
    assert (route.base.host, route.base.port) == (expected.host, expected.port)
    assert route.base.path == expected.path
    assert decode_handle(handle.id) == route  # the bare id string works too


def test_handles_are_base64_json_and_both_alphabets_decode() -> None:
    raw = json.dumps({"u": "http://10.0.0.1:8080", "r": "r??"}, separators=(",", ":")).encode()
    standard = base64.b64encode(raw).decode()
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert "+" in standard or "/" in standard  # the test is only meaningful if they differ
    for text in (standard, urlsafe, f"  {standard}\n"):
        assert decode_handle(SandboxHandle(text)).remote_id == "r??"
    ours = encode_handle("http://10.0.0.1:8080", "r1").id
    assert json.loads(base64.urlsafe_b64decode(ours)) == {"u": "http://10.0.0.1:8080", "r": "r1"}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"null",
        b'{"u": 1, "r": "x"}',
        b'{"u": "http://h", "r": ""}',
        b'{"u": "http://h", "r": ".."}',
        b'{"u": "http://h", "r": "a/b"}',
        b'{"u": "file:///etc", "r": "x"}',
        b'{"u": "http://h?q=1", "r": "x"}',
        b'{"u": "http://", "r": "x"}',
        b"\xff\xfe",
    ],
)
def test_malformed_handles(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_handle(SandboxHandle(base64.b64encode(raw).decode()))


def test_decoded_handles_and_urls_are_cached_and_bad_ones_always_raise() -> None:
    handle = encode_handle("http://10.0.0.7:8080", "rid-cached")
    first, again = decode_handle(handle), decode_handle(handle.id)
    assert first is again
    assert (first.pod_url, first.remote_id) == ("http://10.0.0.7:8080", "rid-cached")
    assert check_base_url("http://10.0.0.7:8080") is first.base
    for _ in range(2):
        with pytest.raises(ValueError, match="malformed sandbox handle"):
            decode_handle("not-a-handle!")
        with pytest.raises(ValueError, match="must be http"):
            check_base_url("ftp://10.0.0.7")
        with pytest.raises(ValueError, match="malformed URL"):
            check_base_url("http://[::1")
        with pytest.raises(ValueError, match="must be a string"):
            check_base_url(5)  # type: ignore[arg-type]


def test_create_reply_becomes_a_handle() -> None:
    handle = decode_created({"pod_url": "http://10.0.0.9:8080", "remote_id": "r9", "x": 1})
    assert decode_handle(handle).remote_id == "r9"
    for bad in (None, [], {"pod_url": "http://h"}, {"pod_url": 5, "remote_id": "r"}):
        with pytest.raises(ProtocolError):
            decode_created(bad)


def test_walk_reply_becomes_entries_checked_one_by_one() -> None:
    class Name(str):
        pass

    reply = {
        "entries": [
            {"path": "/a", "size": 1, "version": "v1", "extra": True},
            {"path": "/b", "size": 0, "version": 7},
            {"path": Name("/c"), "size": 2, "version": "v3"},
        ]
    }
    assert decode_walk(reply) == [
        WalkEntry("/a", 1, "v1"),
        WalkEntry("/b", 0, 7),
        WalkEntry("/c", 2, "v3"),
    ]
    assert decode_walk({"entries": []}) == []
    bad_entries: list[object] = [
        None,
        [],
        {"size": 1, "version": "v"},
        {"path": "/a", "size": True, "version": "v"},
        {"path": "/a", "size": "1", "version": "v"},
        {"path": "/a", "size": 1, "version": None},
        {"path": "/a", "size": 1, "version": False},
        {"path": "/a", "size": 1.5, "version": "v"},
    ]
    for bad in bad_entries:
        with pytest.raises(ProtocolError, match="walk entry"):
            decode_walk({"entries": [{"path": "/ok", "size": 1, "version": "v"}, bad]})
    for bad_reply in (None, {"entries": {}}, {"entries": None}):
        with pytest.raises(ProtocolError, match="walk"):
            decode_walk(bad_reply)


def test_an_exec_body_is_checked_before_any_request() -> None:
    body = exec_body(["sh", "-c", "x"], {"A": "1"}, "d", 2.5, b"in", ["sha1"])
    assert body == {
        "cmd": ["sh", "-c", "x"],
        "env": {"A": "1"},
        "cwd": "d",
        "timeout": 2.5,
        "stdin": "aW4=",
        "tools": ["sha1"],
    }
    assert exec_body(["true"], {}, None, None, None, []) == {"cmd": ["true"]}
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"cmd": "ls -l"}, "cmd must be"),
        ({"cmd": []}, "cmd must be"),
        ({"env": {"A": 1}}, "env must map strings to strings"),
        ({"env": {1: "a"}}, "env must map strings to strings"),
        ({"timeout": True}, "timeout must be"),
        ({"timeout": 0}, "timeout must be"),
        ({"tools": "sha1"}, "tools must be"),
        ({"tools": ["sha1", 2]}, "tools must be"),
    ]
    for change, message in refusals:
        call: dict[str, Any] = {
            "cmd": ["true"],
            "env": None,
            "cwd": None,
            "timeout": None,
            "stdin": None,
            "tools": None,
            **change,
        }
        with pytest.raises(ValueError, match=message):
            exec_body(**call)


def test_a_health_reply_needs_a_status_and_capabilities_of_strings() -> None:
    health = decode_health({"status": "ok", "version": 3, "capabilities": ["a", "b"]})
    assert (health.status, health.version, health.capabilities) == ("ok", "3", ("a", "b"))
    assert decode_health({"status": "draining"}).capabilities == ()
    for bad in ({"status": "ok", "capabilities": "a b"}, {"status": "ok", "capabilities": [1]}):
        with pytest.raises(ProtocolError, match="capabilities must be a list of strings"):
            decode_health(bad)
    with pytest.raises(ProtocolError, match="status"):
        decode_health({"capabilities": []})


def test_the_collector_is_paused_and_resumed_only_if_it_ran() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("decoding failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the application's choice is kept
    finally:
        gc.enable()


def test_spec_sends_only_what_is_set() -> None:
    assert SandboxSpec().to_json() == {}
    assert SandboxSpec(item_id="i", exposed_ports=[1, 2]).to_json() == {
        "item_id": "i",
        "exposed_ports": [1, 2],
    }
    assert SandboxSpec(network="egress").to_json() == {"network": "egress"}
    assert SandboxSpec(deny_out=["192.0.2.1"]).to_json() == {
        "network": {"mode": "egress", "deny_out": ["192.0.2.1"]}
    }
    assert SandboxSpec(network="egress", allow_out=[]).to_json() == {
        "network": {"mode": "egress", "allow_out": [], "deny_out": []}
    }
    ruled = SandboxSpec(rules={"api.example.com": {"Authorization": "Bearer s3cret"}})
    assert ruled.to_json() == {
        "network": {
            "mode": "egress",
            "deny_out": [],
            "rules": {"api.example.com": [{"headers": {"Authorization": "Bearer s3cret"}}]},
        }
    }
    assert "s3cret" not in repr(ruled)


def test_network_replies_are_checked() -> None:
    assert wire.decode_network({"mode": "egress", "allow_out": None, "deny_out": ["a"]}) == (
        NetworkInfo("egress", None, ("a",))
    )
    assert wire.decode_network({"mode": "egress", "allow_out": ["b"]}).allow_out == ("b",)
    with pytest.raises(ProtocolError, match="allow_out: expected a list of strings"):
        wire.decode_network({"mode": "egress", "allow_out": [1]})
    shown = {"mode": "egress", "rules": {"api.example.com": ["Authorization"]}}
    assert wire.decode_network(shown).rules == {"api.example.com": ("Authorization",)}
    with pytest.raises(ProtocolError, match="network rules: expected a JSON object"):
        wire.decode_network({"mode": "egress", "rules": ["x"]})
    with pytest.raises(ProtocolError, match="network rules: expected a list of strings"):
        wire.decode_network({"mode": "egress", "rules": {"a.example": "X"}})


def test_stats_name_the_cpus_of_a_placed_sandbox() -> None:
    counters = {"memory_bytes": 1, "memory_peak_bytes": 2, "cpu_usec": 3, "pids": 4}
    assert wire.decode_stats({**counters, "oom_kills": 0, "cpus": [0, 2]}).cpus == (0, 2)
    assert wire.decode_stats({**counters, "cpus": None}).cpus is None
    assert wire.decode_stats(counters).cpus is None  # a daemon that does not place
    for bad in ("0-1", [True], [-1], ["0"]):
        with pytest.raises(ProtocolError, match="cpus: expected a list of CPU numbers"):
            wire.decode_stats({**counters, "cpus": bad})


def test_a_socks5_proxy_is_sent_with_its_password_and_never_shows_it() -> None:
    proxy = Socks5("203.0.113.80:1080", "me", "pw-s3cret")
    spec = SandboxSpec(socks5=proxy)
    assert spec.to_json() == {
        "network": {
            "mode": "egress",
            "deny_out": [],
            "socks5": {"address": "203.0.113.80:1080", "username": "me", "password": "pw-s3cret"},
        }
    }
    for shown in (repr(proxy), str(proxy), repr(spec), str(spec)):
        assert "pw-s3cret" not in shown and "203.0.113.80:1080" in shown
    tls = SandboxSpec(
        network="egress", deny_out=["192.0.2.1"], socks5=Socks5("[2001:db8::1]:1", tls=True)
    )
    assert tls.to_json()["network"] == {
        "mode": "egress",
        "deny_out": ["192.0.2.1"],
        "socks5": {"address": "[2001:db8::1]:1", "tls": True},
    }


def test_a_socks5_proxy_sends_its_tls_server_name_and_ca_never_showing_the_ca() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB-ca-s3cret\n-----END CERTIFICATE-----\n"
    assert Socks5("a:1", tls=Socks5TLS()).to_json() == {"address": "a:1", "tls": True}
    assert Socks5("a:1", tls=False).to_json() == {"address": "a:1"}
    named = Socks5("a:1", tls=Socks5TLS("proxy.example"))
    assert named.to_json()["tls"] == {"enabled": True, "server_name": "proxy.example"}
    own_ca = Socks5("a:1", "me", "pw-s3cret", Socks5TLS(ca_cert=pem))
    assert own_ca.to_json()["tls"] == {"enabled": True, "ca_cert": pem}
    both = Socks5TLS("proxy.example", pem)
    assert both.to_json() == {"enabled": True, "server_name": "proxy.example", "ca_cert": pem}
    for shown in (repr(own_ca), repr(both), str(SandboxSpec(socks5=own_ca))):
        assert "ca-s3cret" not in shown and "pw-s3cret" not in shown
    assert "proxy.example" in repr(both)


def test_a_listed_socks5_proxy_is_read_back() -> None:
    shown = {"mode": "egress", "socks5": {"address": "203.0.113.80:1080", "username": "me"}}
    assert wire.decode_network(shown).socks5 == Socks5("203.0.113.80:1080", "me")
    assert wire.decode_network({"mode": "egress"}).socks5 is None
    named = {"enabled": True, "server_name": "proxy.example"}
    for tls, on in (
        (True, True),
        (False, False),
        (None, False),
        ({"enabled": True}, True),
        ({}, True),
        ({"enabled": False}, False),
        (named, Socks5TLS("proxy.example")),
    ):
        listed = wire.decode_network({"mode": "egress", "socks5": {"address": "a:1", "tls": tls}})
        assert listed.socks5 == Socks5("a:1", tls=on)
    for bad, message in (
        (["a:1"], "network socks5: expected a JSON object"),
        ({"username": "me"}, "network socks5: field 'address' missing"),
        ({"address": "a:1", "username": 7}, "network socks5: username must be a string"),
        ({"address": "a:1", "tls": {"server_name": 7}}, "tls server_name must be a string"),
    ):
        with pytest.raises(ProtocolError, match=message):
            wire.decode_network({"mode": "egress", "socks5": bad})


def test_ipv6_literal_hosts_survive_treq() -> None:
    url = DecodedURL.from_text("http://[2001:db8::8a2e:370:7334]:8080/sandboxes").add("p", "a+b")
    uri = standin_url(url).encoded_url.to_uri().to_text().encode()  # what treq does
    assert literal_uri(uri) == b"http://[2001:db8::8a2e:370:7334]:8080/sandboxes?p=a%2Bb"
    assert standin_url(DecodedURL.from_text("http://10.0.0.1/")).host == "10.0.0.1"
    assert literal_uri(b"http://v6-zz.example/") == b"http://v6-zz.example/"


# -- error mapping -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "etype", "exc"),
    [
        (404, "SandboxNotFound", SandboxNotFound),
        (404, None, SandboxNotFound),
        (404, "FileNotFoundError", FileNotFoundError),
        (400, "BadRequest", ValueError),
        (401, "Unauthorized", PermissionError),
        (413, "TooLarge", TooLarge),
        (503, "Draining", SandboxUnavailable),
        (503, "NoCapacity", SandboxUnavailable),
        (504, None, SandboxBusy),
        (500, "Internal", SandboxError),
        (502, None, SandboxError),
    ],
)
def test_statuses_map_to_the_error_model(status: int, etype: str | None, exc: type) -> None:
    err = error_for(status, etype, "d")
    assert type(err) is exc
    assert not isinstance(err, SandboxNotFound) or status == 404


def test_507_is_enospc_and_frames_map_by_type() -> None:
    err = error_for(507, "InsufficientStorage", "full")
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert isinstance(error_from_frame("Unauthorized", "x"), PermissionError)
    assert isinstance(error_from_frame(None, None), SandboxError)
    assert isinstance(error_from_frame("PathNotFound", "cwd"), FileNotFoundError)
    assert isinstance(error_from_frame("FileNotFoundError", "cwd"), FileNotFoundError)


def _wrapped(cls: type, *inner: BaseException) -> BaseException:
    exc: BaseException = cls([Failure(e) for e in inner])
    return exc


@pytest.mark.parametrize(
    ("exc", "timed_out", "expected"),
    [
        (ierror.ConnectionRefusedError(), False, SandboxNotFound),
        (_wrapped(ResponseNeverReceived, ierror.ConnectionLost()), False, SandboxNotFound),
        (_wrapped(ResponseFailed, ierror.ConnectionDone()), False, SandboxNotFound),
        (ierror.NoRouteError(), False, SandboxNotFound),
        (ierror.DNSLookupError("x"), False, SandboxNotFound),
        (ierror.TimeoutError(), False, SandboxBusy),
        (ierror.TCPTimedOutError(), False, SandboxBusy),
        (_wrapped(ResponseNeverReceived, CancelledError()), True, SandboxBusy),
        (CancelledError(), True, SandboxBusy),
        (CancelledError(), False, CancelledError),
        (_wrapped(ResponseNeverReceived, CancelledError()), False, CancelledError),
        (ierror.ConnectingCancelledError(None), False, CancelledError),
        (KeyError("bug"), False, KeyError),
        (TimeoutError(), False, SandboxBusy),
        (ConnectionResetError(), False, SandboxNotFound),
        (SandboxNotFound("x"), True, SandboxBusy),
    ],
)
def test_transport_failures_map_to_the_error_model(
    exc: BaseException, timed_out: bool, expected: type
) -> None:
    assert type(error_from_transport(exc, timed_out=timed_out, service=False)) is expected


def test_service_addresses_are_unavailable_not_not_found() -> None:
    err = error_from_transport(ierror.ConnectionRefusedError(), timed_out=False, service=True)
    assert type(err) is SandboxUnavailable


def test_an_error_body_that_is_no_json_object_still_maps_by_status() -> None:
    for raw in (b"[1, 2]", b'"text"', b"\xff", b"<html>busy</html>"):
        err = error_from_response(503, raw)
        assert type(err) is SandboxUnavailable and str(err).startswith("HTTP 503")
    assert str(error_from_response(404, b"")) == "HTTP 404"
    err = error_from_response(404, b'{"error": 5, "detail": "gone"}')
    assert type(err) is SandboxNotFound and str(err) == "gone"


def test_a_wrapper_reason_that_is_no_exception_is_passed_over() -> None:
    wrapped = ResponseFailed(["not an exception", Failure(ierror.ConnectionLost())])
    err = error_from_transport(wrapped, timed_out=False, service=False)
    assert type(err) is SandboxNotFound and "ConnectionLost" in str(err)


def test_a_failing_request_body_is_reraised_as_itself() -> None:
    local = PermissionError(errno.EACCES, "denied")
    err = error_from_transport(
        _wrapped(RequestGenerationFailed, local), timed_out=False, service=False
    )
    assert err is local


# -- retry policy --------------------------------------------------------------------------


def test_deadlines_and_backoffs_grow_and_are_capped() -> None:
    p = RetryPolicy(
        attempts=6,
        timeout=1,
        timeout_growth=2,
        max_timeout=5,
        backoff=0.5,
        backoff_growth=3,
        max_backoff=4,
    )
    assert [p.deadline(n) for n in range(6)] == [1, 2, 4, 5, 5, 5]
    assert [p.delay(n) for n in range(6)] == [0, 0.5, 1.5, 4, 4, 4]


def _run(
    clock: Clock, policy: RetryPolicy, outcomes: list[Any], **kw: Any
) -> tuple[Deferred[Any], list[float], list[float]]:
    """Drive ``retrying`` on a fake clock; ``outcomes`` are the attempts' results in turn."""
    deadlines: list[float] = []
    started: list[float] = []

    async def attempt(deadline: float) -> Any:
        deadlines.append(deadline)
        started.append(clock.seconds())
        outcome = outcomes.pop(0)
        return await (fail(outcome) if isinstance(outcome, BaseException) else succeed(outcome))

    d = ensureDeferred(retrying(clock, policy, attempt, **kw))
    for _ in range(50):
        clock.advance(1)
    return d, deadlines, started


def test_busy_is_retried_with_growing_deadlines_and_backoffs() -> None:
    clock = Clock()
    p = RetryPolicy(
        attempts=4,
        timeout=1,
        timeout_growth=2,
        max_timeout=3,
        backoff=1,
        backoff_growth=2,
        max_backoff=2,
    )
    d, deadlines, started = _run(clock, p, [SandboxBusy("slow")] * 4)
    failure = []
    d.addErrback(failure.append)
    assert failure[0].check(SandboxBusy) and "after 4 attempts" in str(failure[0].value)
    assert deadlines == [1, 2, 3, 3]
    assert started == [0, 1, 3, 5]  # waited 1, 2, 2


def test_only_busy_is_retried_and_success_stops() -> None:
    clock = Clock()
    d, deadlines, _ = _run(clock, RetryPolicy(), [SandboxBusy("x"), 42])
    assert d.result == 42 and len(deadlines) == 2
    d2, deadlines2, _ = _run(clock, RetryPolicy(), [SandboxNotFound("dead")])
    d2.addErrback(lambda f: f.trap(SandboxNotFound))
    assert len(deadlines2) == 1


def test_gone_counts_as_done_only_after_a_timeout() -> None:
    clock = Clock()
    d, _, _ = _run(
        clock, RetryPolicy(), [SandboxBusy("x"), FileNotFoundError()], gone_ok=FileNotFoundError
    )
    assert d.result is None
    d2, _, _ = _run(clock, RetryPolicy(), [FileNotFoundError()], gone_ok=FileNotFoundError)
    errors: list[Failure] = []
    d2.addErrback(errors.append)
    assert errors[0].check(FileNotFoundError)


class _Body:
    """A response whose body is delivered over ``transport``, as Twisted's client does it."""

    length = UNKNOWN_LENGTH

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.protocol: Any = None

    def deliverBody(self, protocol: Any) -> None:
        self.protocol = protocol
        protocol.makeConnection(self.transport)


def test_a_body_is_read_a_megabyte_at_a_time_then_the_connection_reads_as_before() -> None:
    connection = FileDescriptor(reactor=Clock())  # type: ignore[arg-type]
    assert connection.bufferSize == 1 << 16  # Twisted's
    response = _Body(TransportProxyProducer(connection))
    got: list[bytes] = []
    done = read_body(Clock(), response, got.append, 5.0)  # type: ignore[arg-type]
    assert connection.bufferSize == body.READ_SIZE
    response.protocol.dataReceived(b"x")
    response.protocol.connectionLost(Failure(ResponseDone()))
    assert got == [b"x"] and done.called
    assert connection.bufferSize == 1 << 16
    # A later upload on the pooled connection is sent a megabyte at a time, not 128 KiB.
    assert connection.SEND_LIMIT == body.READ_SIZE


def test_other_transports_and_larger_reads_are_left_alone() -> None:
    connection = FileDescriptor(reactor=Clock())  # type: ignore[arg-type]
    connection.bufferSize = 4 * body.READ_SIZE
    for transport in (TransportProxyProducer(connection), object()):
        response = _Body(transport)
        read_body(Clock(), response, lambda data: None, 5.0)  # type: ignore[arg-type]
        response.protocol.connectionLost(Failure(ResponseDone()))
    assert connection.bufferSize == 4 * body.READ_SIZE


class _Consumer:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_a_small_body_is_written_whole_at_once_a_large_one_in_turns() -> None:
    clock = Clock()
    transport = Transport(
        clock,
        clock=clock,
        token=None,
        pool=None,
        agent=object(),  # type: ignore[arg-type]
        connect_timeout=None,
        max_persistent_per_host=1,
        cached_connection_timeout=1.0,
    )
    small = transport.producer(bytearray(b'{"cmd":["true"]}'))
    assert isinstance(small, body.BytesProducer) and small.length == 16
    consumer = _Consumer()
    done = small.startProducing(consumer)  # type: ignore[arg-type]
    assert done.called and consumer.written == [b'{"cmd":["true"]}']  # in this very turn
    small.pauseProducing(), small.resumeProducing(), small.stopProducing()  # nothing to do
    large = transport.producer(b"x" * (body.SMALL_BODY + 1))
    assert isinstance(large, FileBodyProducer)
    assert large.length == body.SMALL_BODY + 1
    transport.close()


def test_sandbox_urls_are_remembered_and_bad_handles_always_refused() -> None:
    handle = encode_handle("http://10.0.0.5:8080", "r1")
    url = sandbox_url(handle, ("exec",))
    assert url.to_text() == "http://10.0.0.5:8080/sandboxes/r1/exec"
    assert sandbox_url(handle, ("exec",)) is url
    for _ in range(2):
        with pytest.raises(ValueError):
            sandbox_url("not a handle", ("exec",))
