"""Request bodies paced while other connections' requests come in, on a Clock: the pace and
its meter alone, then the channel's reading (a string transport's producer state) with the
pace on and off, beside a refused request, and beside the spool's own hold."""

from collections.abc import Callable

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.resource import Resource
from twisted.web.server import Request

from sandboxd.http.api import admission
from sandboxd.web.body_pace import BURST, WINDOW, BodyPace, ReadHolds
from sandboxd.web.guard import ConnectionGate, Limits
from sandboxd.web.request import SPOOL
from sandboxd.web.site import Channel, make_site

PEER = IPv4Address("TCP", "127.0.0.1", 40000)
RATE = 100_000
"""Bytes a second, in the tests."""
UPLOAD = b"PUT /x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\ncontent-length: 900000\r\n\r\n"
OTHER = b"GET /x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\n\r\n"
CHUNK = 300_000


class Transport(StringTransport):
    def loseWriteConnection(self) -> None:
        """A refused request's answer is followed by a half-close."""


class Ok(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        return b"ok"


# The pace and its meter


def test_a_lone_body_is_never_paced() -> None:
    clock = Clock()
    pace = BodyPace(clock, RATE)
    uploader = object()
    pace.began(uploader)
    meter = pace.meter(uploader)
    assert meter.received(10 * RATE) == 0.0
    pace.began(uploader)  # its own next request is not another's
    assert meter.received(10 * RATE) == 0.0


def test_a_body_is_paced_while_another_connection_began_a_request_within_the_window() -> None:
    clock = Clock()
    pace = BodyPace(clock, RATE)
    uploader, other = object(), object()
    pace.began(uploader)
    meter = pace.meter(uploader)
    pace.began(other)
    assert meter.received(RATE) == pytest.approx(1.0 - BURST)
    assert meter.received(RATE) == pytest.approx(2.0 - BURST)  # what it owes adds up
    clock.advance(1.0)
    assert meter.owed() == pytest.approx(1.0 - BURST)
    clock.advance(WINDOW)  # the other's request is past the window: full speed again
    assert not pace.others_lately(uploader)
    assert meter.received(10 * RATE) == 0.0
    assert meter.owed() == 0.0


def test_the_pace_keeps_the_other_connection_once_the_uploader_begins_again() -> None:
    clock = Clock()
    pace = BodyPace(clock, RATE)
    uploader, other = object(), object()
    pace.began(other)
    clock.advance(0.1)
    pace.began(uploader)  # the latest now: the other's start is still within the window
    assert pace.others_lately(uploader)
    assert pace.others_lately(other)
    clock.advance(WINDOW)
    assert not pace.others_lately(uploader)


def test_without_a_rate_nothing_is_paced() -> None:
    clock = Clock()
    pace = BodyPace(clock, None)
    uploader = object()
    pace.began(object())
    assert pace.meter(uploader).received(10 * RATE) == 0.0


def test_read_holds_resume_only_once_every_reason_is_released() -> None:
    transport = StringTransport()
    holds = ReadHolds(transport)
    holds.hold("a")
    holds.hold("b")
    holds.hold("a")
    assert transport.producerState == "paused"
    holds.release("a")
    holds.release("a")  # not held any more: nothing
    assert transport.producerState == "paused"
    assert holds.held == {"b"}
    holds.release("b")
    assert transport.producerState == "producing"
    holds.release("c")  # never held: nothing
    assert transport.producerState == "producing"


# The channel


def connect(clock: Clock, pace: BodyPace | None, gate: ConnectionGate | None = None) -> Channel:
    site = make_site(Ok(), 1 << 20, gate=gate, admit=admission(b"t"), pace=pace)
    channel = site.buildProtocol(PEER)
    assert isinstance(channel, Channel)
    channel.makeConnection(Transport(peerAddress=PEER))
    return channel


def producer_state(channel: Channel) -> str:
    transport = channel.transport
    assert isinstance(transport, StringTransport)
    state: str = transport.producerState
    return state


def uploading_beside_another(
    pace: Callable[[Clock, int], BodyPace] | None,
) -> tuple[Clock, Channel, Channel]:
    """An upload's headers in on one connection, then another connection's whole request;
    both on a site with the pace ``pace`` makes (``None``: none)."""
    clock = Clock()
    made = None if pace is None else pace(clock, RATE)
    uploader, other = connect(clock, made), connect(clock, made)
    uploader.dataReceived(UPLOAD)
    other.dataReceived(OTHER)
    return clock, uploader, other


@pytest.mark.parametrize("paced", [True, False], ids=["paced", "off"])
def test_an_upload_stops_reading_while_another_connections_request_comes_in(paced: bool) -> None:
    clock, uploader, other = uploading_beside_another(BodyPace if paced else None)
    uploader.dataReceived(b"x" * CHUNK)
    if not paced:  # the protection off: the uploader reads on at full speed
        assert producer_state(uploader) == "producing"
        return
    assert producer_state(uploader) == "paused"
    clock.advance(CHUNK / RATE - BURST - 0.01)
    assert producer_state(uploader) == "paused"
    clock.advance(0.02)
    assert producer_state(uploader) == "producing"
    assert producer_state(other) == "producing"  # the other's reading is never held


def test_what_arrives_while_paused_extends_the_pause() -> None:
    clock, uploader, _ = uploading_beside_another(BodyPace)
    uploader.dataReceived(b"x" * (CHUNK // 2))
    uploader.dataReceived(b"x" * (CHUNK // 2))  # read in the same turn, before the pause
    clock.advance(CHUNK / RATE / 2)
    assert producer_state(uploader) == "paused"
    clock.advance(CHUNK / RATE / 2)
    assert producer_state(uploader) == "producing"


def test_a_request_refused_at_its_headers_paces_no_one() -> None:
    clock = Clock()
    pace = BodyPace(clock, RATE)
    gate = ConnectionGate(clock, Limits(8, 1, 10.0, 60.0))
    uploader, stranger = connect(clock, pace, gate), connect(clock, pace, gate)
    uploader.dataReceived(UPLOAD)
    stranger.dataReceived(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")  # no token: 401
    assert isinstance(stranger.transport, StringTransport)
    assert stranger.transport.value().startswith(b"HTTP/1.1 401")
    uploader.dataReceived(b"x" * CHUNK)
    assert producer_state(uploader) == "producing"
    other = connect(clock, pace, gate)
    other.dataReceived(OTHER)  # admitted: it counts
    uploader.dataReceived(b"x" * CHUNK)
    assert producer_state(uploader) == "paused"


def test_the_pace_ending_does_not_resume_what_the_spool_still_holds() -> None:
    clock, uploader, _ = uploading_beside_another(BodyPace)
    uploader.dataReceived(b"x" * CHUNK)
    uploader.hold(SPOOL)  # the body's writes fell behind meanwhile
    clock.advance(CHUNK / RATE)
    assert producer_state(uploader) == "paused"
    uploader.release(SPOOL)
    assert producer_state(uploader) == "producing"


def test_a_body_in_whole_is_answered_and_then_read_on_without_its_pause() -> None:
    clock, uploader, _ = uploading_beside_another(BodyPace)
    uploader.dataReceived(b"x" * 900_000)  # the whole body: answered at once
    transport = uploader.transport
    assert isinstance(transport, StringTransport)
    assert transport.value().startswith(b"HTTP/1.1 200")
    assert producer_state(uploader) == "producing"  # twisted.web resumed it after answering
    assert not [call for call in clock.getDelayedCalls() if call.active()]


def test_a_lost_connection_cancels_its_pause() -> None:
    clock, uploader, _ = uploading_beside_another(BodyPace)
    uploader.dataReceived(b"x" * CHUNK)
    assert clock.getDelayedCalls()
    uploader.connectionLost(ConnectionError("gone"))  # type: ignore[arg-type]
    assert not [call for call in clock.getDelayedCalls() if call.active()]
