"""The channel's defences on a Clock and a string transport: the idle deadline between requests,
the header deadline, and a paced 401 whose peer left before its turn."""

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Request

from sandboxd.http.api import admission
from sandboxd.web.guard import ConnectionGate, Limits, PeerPace
from sandboxd.web.site import Channel, make_site

PEER = IPv4Address("TCP", "127.0.0.1", 40000)


class Transport(StringTransport):
    write_closed = False
    aborted = False

    def loseWriteConnection(self) -> None:
        self.write_closed = True

    def abortConnection(self) -> None:
        self.aborted = True
        super().abortConnection()


class Ok(Resource):
    isLeaf = True

    def render(self, request: Request) -> bytes:
        return b"ok"


def connect(gate: ConnectionGate) -> tuple[Channel, Transport]:
    site = make_site(Ok(), 1 << 20, gate=gate, admit=admission(b"t"))
    channel = site.buildProtocol(PEER)
    assert isinstance(channel, Channel)
    transport = Transport(peerAddress=PEER)
    channel.makeConnection(transport)
    return channel, transport


def lose(channel: Channel) -> None:
    channel.connectionLost(Failure(ConnectionError("gone")))


def test_a_kept_alive_connection_is_closed_once_idle_past_its_deadline() -> None:
    clock = Clock()
    gate = ConnectionGate(clock, Limits(8, 1, 1.0, 5.0))
    channel, transport = connect(gate)
    channel.dataReceived(b"GET / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 200")
    assert gate.untrusted == 0  # it carried the token
    clock.advance(4.9)
    assert not transport.disconnecting
    channel.dataReceived(b"GET / HTTP/1.1\r\n")  # a byte now and then does not reset it
    clock.advance(0.2)
    assert transport.disconnecting
    lose(channel)
    assert gate.open == 0


def test_the_header_section_has_a_deadline_from_the_connection() -> None:
    clock = Clock()
    gate = ConnectionGate(clock, Limits(8, 1, 1.0, 5.0))
    channel, transport = connect(gate)
    for _ in range(9):
        channel.dataReceived(b"G")
        clock.advance(0.1)
    assert not transport.disconnecting
    clock.advance(0.2)
    assert transport.disconnecting and transport.value() == b""
    lose(channel)


def test_a_paced_401_is_not_sent_once_its_peer_is_gone() -> None:
    clock = Clock()
    gate = ConnectionGate(clock, Limits(8, 1, 10.0, 5.0))
    gate.pace = PeerPace(clock, burst=1, rate=1.0, max_wait=5.0)
    first, first_transport = connect(gate)
    first.dataReceived(b"POST /sandboxes HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nbody!")
    assert first_transport.value().startswith(b"HTTP/1.1 401 Unauthorized")
    assert first_transport.write_closed
    second, second_transport = connect(gate)
    second.dataReceived(b"POST /sandboxes HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
    assert second_transport.value() == b""  # its turn is a second away
    lose(second)
    clock.advance(1.0)
    assert second_transport.value() == b""
    clock.advance(2.0)  # the first one's linger ends: closed
    assert first_transport.disconnecting
    lose(first)
    assert gate.open == 0


def test_a_stopping_site_closes_each_connection_once_its_answer_is_out() -> None:
    clock = Clock()
    site = make_site(Ok(), 1 << 20, gate=ConnectionGate(clock, Limits(8, 1, 10.0, 60.0)))
    opened = []
    for _ in range(2):
        channel = site.buildProtocol(PEER)
        assert isinstance(channel, Channel)
        transport = Transport(peerAddress=PEER)
        channel.makeConnection(transport)
        opened.append((channel, transport))
    (first, sent), (second, stalled) = opened
    assert site.channels == {first, second}
    closing = site.close_connections(clock, 5.0)
    # Each is closed once what was written to it is sent, not cut off.
    assert sent.disconnecting and stalled.disconnecting and not stalled.aborted
    lose(first)  # the first one's peer took everything: its transport closed
    assert site.channels == {second} and not closing.called
    clock.advance(5.0)  # the second one's peer took nothing in time: cut off
    assert stalled.aborted
    lose(second)
    assert closing.called and site.channels == set()
    assert site.close_connections(clock, 5.0).called  # nothing left to close


def test_a_closed_connection_is_not_closed_again() -> None:
    clock = Clock()
    channel, transport = connect(ConnectionGate(clock, Limits(8, 1, 10.0, 60.0)))
    lose(channel)
    assert channel.close_when_flushed(clock, 5.0).called and not transport.disconnecting


def test_a_connection_the_full_gate_refuses_is_cut_off_at_once() -> None:
    clock = Clock()
    gate = ConnectionGate(clock, Limits(1, 0, 1.0, 5.0))
    trusted, _ = connect(gate)
    trusted.dataReceived(b"GET / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\n\r\n")
    refused, transport = connect(gate)  # full, and the one open is not evictable
    assert transport.aborted and transport.value() == b""
    assert gate.open == 1  # the refused one was never counted
    lose(refused)
    assert gate.open == 1
    lose(trusted)
    assert gate.open == 0
