"""``sandboxd.listen``: which sockets an endpoint string claims, and listening on them for real
(loopback, free ports, the real reactor)."""

from __future__ import annotations

import errno
import http.client
import socket
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import Site

from sandboxd import listen
from sandboxd.listen import Address, CannotListen, Listeners, plan


def test_split_endpoint_as_twisted_does() -> None:
    assert listen.split_endpoint(r"tcp6:8080:interface=\:\:1:backlog=5") == (
        "tcp6",
        ["8080"],
        {"interface": "::1", "backlog": "5"},
    )
    assert listen.split_endpoint("TCP:port=1") == ("tcp", [], {"port": "1"})


V4, V6 = socket.AF_INET, socket.AF_INET6


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("tcp:8080", [(V4, "0.0.0.0"), (V6, "::")]),
        ("tcp:8080:interface=0.0.0.0", [(V4, "0.0.0.0"), (V6, "::")]),
        ("tcp6:8080", [(V4, "0.0.0.0"), (V6, "::")]),
        ("tcp:8080:interface=127.0.0.1", [(V4, "127.0.0.1"), (V6, "::1")]),
        (r"tcp6:8080:interface=\:\:1", [(V4, "127.0.0.1"), (V6, "::1")]),
        ("tcp:8080:interface=localhost", [(V4, "127.0.0.1"), (V6, "::1")]),
        ("tcp:8080:interface=192.0.2.7", [(V4, "192.0.2.7")]),
        (r"tcp6:8080:interface=2001\:db8\:\:1", [(V6, "2001:db8::1")]),
    ],
)
def test_plan_claims_both_families(description: str, expected: list[tuple[int, str]]) -> None:
    assert plan(description) == [Address(f, h, 8080) for f, h in expected]  # type: ignore[arg-type]


def test_plan_keeps_the_backlog_and_leaves_other_endpoints_to_twisted() -> None:
    assert plan("tcp:port=9:backlog=7") == [Address(V4, "0.0.0.0", 9, 7), Address(V6, "::", 9, 7)]
    assert plan("unix:/run/sandboxd.sock") is None
    assert plan("systemd:domain=INET:index=0") is None


@pytest.mark.parametrize(
    "description", ["tcp:http", "tcp:8080:backlog=many", "tcp:8080:interface=eth0"]
)
def test_plan_refuses_what_it_cannot_read(description: str) -> None:
    with pytest.raises(CannotListen, match="tcp:"):
        plan(description)


@pytest.mark.parametrize(
    ("description", "beyond"),
    [
        ("tcp:8080", True),
        ("tcp6:8080", True),
        ("tcp:8080:interface=192.0.2.7", True),
        ("tcp:8080:interface=127.0.0.1", False),
        ("tcp:8080:interface=127.0.0.2", False),
        (r"tcp6:8080:interface=\:\:1", False),
        ("tcp:8080:interface=localhost", False),
        ("ssl:8443:interface=127.0.0.1:privateKey=k.pem", False),
        ("ssl:8443:privateKey=k.pem", True),
        ("unix:/run/sandboxd.sock", False),
        ("systemd:domain=INET:index=0", True),
    ],
)
def test_reaches_beyond_loopback(description: str, beyond: bool) -> None:
    assert listen.reaches_beyond_loopback(description) is beyond


def test_capabilities() -> None:
    assert listen.capabilities("tcp:8080", True) == ["listen.dual-stack"]
    assert listen.capabilities("tcp:8080", False) == []
    assert listen.capabilities("unix:/x", True) == []


def test_bind_skips_a_family_the_kernel_lacks() -> None:
    def no_ipv6(family: socket.AddressFamily) -> socket.socket:
        if family == V6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return listen.new_socket(family)

    bound = listen.bind_all(plan("tcp:0:interface=127.0.0.1") or [], no_ipv6)
    try:
        assert [s.family for s in bound] == [V4]
    finally:
        for s in bound:
            s.close()


def test_bind_names_a_socket_that_cannot_be_made() -> None:
    def refused(family: socket.AddressFamily) -> socket.socket:
        raise OSError(errno.EMFILE, "Too many open files")

    with pytest.raises(CannotListen, match=r"127.0.0.1:0: Too many open files"):
        listen.bind(Address(V4, "127.0.0.1", 0), refused)


def test_bind_all_takes_one_port_and_fails_whole() -> None:
    bound = listen.bind_all(plan("tcp:0:interface=127.0.0.1") or [])
    try:
        ports = {s.getsockname()[1] for s in bound}
        assert len(ports) == 1 and [s.family for s in bound] == [V4, V6]
        (port,) = ports
        # The first address bound, the second not to be had: nothing is left listening.
        with socket.socket(V4) as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        with pytest.raises(CannotListen, match=r"\[2001:db8::1\]:\d+: Cannot assign") as caught:
            listen.bind_all([Address(V4, "127.0.0.1", free), Address(V6, "2001:db8::1", 0)])
        assert caught.value.errno == errno.EADDRNOTAVAIL
        with socket.socket(V4) as again:
            again.bind(("127.0.0.1", free))  # closed again
        with pytest.raises(CannotListen, match="Address already in use") as taken:
            listen.bind_all([Address(V6, "::1", port)])
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        for s in bound:
            s.close()


def status_of(host: str, port: int) -> int:
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request("GET", "/")
        return connection.getresponse().status
    finally:
        connection.close()


class Ok(Resource):
    isLeaf = True

    def render_GET(self, request: object) -> bytes:
        return b"ok"


def site() -> Site:
    return Site(Ok())


@pytest_twisted.ensureDeferred
async def test_listeners_serve_both_families_and_stop() -> None:
    from twisted.internet import reactor

    listeners = Listeners(reactor, "tcp:0:interface=127.0.0.1", site())
    listeners.startService()
    shown = await listeners.listen()
    port = int(shown[0].rsplit(":", 1)[1])
    assert shown == [f"127.0.0.1:{port}", f"[::1]:{port}"]
    for host in ("127.0.0.1", "::1"):
        assert await deferToThread(status_of, host, port) == 200
    await listeners.stopService()
    assert listeners.ports == []
    with socket.socket(V6) as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past our TIME_WAIT
        again.bind(("::1", port))


@pytest_twisted.ensureDeferred
async def test_listeners_take_other_endpoints_as_given(tmp_path: Path) -> None:
    from twisted.internet import reactor

    path = tmp_path / "api.sock"
    listeners = Listeners(reactor, f"unix:{path}", Factory.forProtocol(Protocol))
    assert await listeners.listen() == [f"unix:{path}"]
    assert path.exists()
    await listeners.stopService()
    taken = Listeners(reactor, f"unix:{tmp_path / 'missing' / 'api.sock'}", site())
    with pytest.raises(CannotListen, match="missing"):
        await taken.listen()


@pytest_twisted.ensureDeferred
async def test_dual_stack_off_listens_as_twisted_does() -> None:
    from twisted.internet import reactor

    listeners = Listeners(reactor, "tcp:0:interface=127.0.0.1", site(), dual_stack=False)
    (shown,) = await listeners.listen()
    assert shown == "tcp:0:interface=127.0.0.1"
    (port,) = listeners.ports
    assert port.getHost().host == "127.0.0.1"  # type: ignore[attr-defined]
    await listeners.stopService()


@pytest_twisted.ensureDeferred
async def test_a_port_in_use_is_freed_of_dead_connections_once() -> None:
    from twisted.internet import reactor

    with socket.socket(V4) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cleared: list[int] = []

        def destroy(number: int) -> int:
            cleared.append(number)
            holder.close()  # what the destroyed connections held
            return 2

        listeners = Listeners(
            reactor, f"tcp:{port}:interface=127.0.0.1", site(), destroy_orphans=destroy
        )
        assert len(await listeners.listen()) == 2
        assert cleared == [port]
        await listeners.stopService()


@pytest.mark.parametrize(
    ("destroyed", "match"),
    [
        (0, r"Address already in use$"),
        (OSError(errno.EPERM, "Operation not permitted"), "cannot be removed here: Operation"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_port_held_by_a_live_socket_stops_listening(
    destroyed: int | OSError, match: str
) -> None:
    from twisted.internet import reactor

    def destroy(number: int) -> int:
        if isinstance(destroyed, OSError):
            raise destroyed
        return destroyed

    with socket.socket(V4) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        listeners = Listeners(
            reactor, f"tcp:{port}:interface=127.0.0.1", site(), destroy_orphans=destroy
        )
        with pytest.raises(CannotListen, match=match):
            await listeners.listen()
        assert listeners.ports == []


@pytest_twisted.ensureDeferred
async def test_another_error_is_not_retried() -> None:
    from twisted.internet import reactor

    def destroy(number: int) -> int:
        raise AssertionError("not called")

    listeners = Listeners(reactor, "tcp:0:interface=192.0.2.7", site(), destroy_orphans=destroy)
    with pytest.raises(CannotListen, match=r"192\.0\.2\.7:0: Cannot assign requested address"):
        await listeners.listen()
