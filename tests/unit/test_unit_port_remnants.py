"""``sandboxd.port_remnants`` against the real kernel: a squatter's closed connections in
``TIME_WAIT`` block a bind of their port until they are destroyed; live connections stay."""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import sys

import pytest

from sandboxd import port_remnants

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="SOCK_DESTROY needs CAP_NET_ADMIN")


def squat_and_leave(family: socket.AddressFamily, host: str) -> int:
    """A port on which a listener without SO_REUSEADDR accepted and closed a connection
    (``TIME_WAIT`` on its side), then went away."""
    with socket.socket(family) as squatter:
        squatter.bind((host, 0))
        squatter.listen()
        port = int(squatter.getsockname()[1])
        with socket.create_connection((host, port)) as client:
            accepted, _ = squatter.accept()
            accepted.close()  # the squatter closes first: its end waits in TIME_WAIT
            client.recv(1)
    return port


def bind_error(family: socket.AddressFamily, host: str, port: int) -> int | None:
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            return e.errno
    return None


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_time_wait_left_by_a_dead_squatter_is_destroyed(
    family: socket.AddressFamily, host: str
) -> None:
    port = squat_and_leave(family, host)
    assert bind_error(family, host, port) == errno.EADDRINUSE
    assert port_remnants.destroy_orphans(port) == 1
    assert bind_error(family, host, port) is None
    assert port_remnants.destroy_orphans(port) == 0


def test_a_live_connection_on_the_port_is_left_alone() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                assert port_remnants.destroy_orphans(port) == 0
                client.sendall(b"x")
                assert accepted.recv(1) == b"x"


def test_a_refused_request_raises_with_the_kernels_errno() -> None:
    error = struct.pack("=i", -errno.EOPNOTSUPP)
    message = (
        port_remnants._HEADER.pack(port_remnants._HEADER.size + len(error), 2, 0, 0, 0) + error
    )

    class Kernel:
        def recv(self, size: int) -> bytes:
            return message

        def send(self, data: bytes) -> int:
            return len(data)

    with pytest.raises(OSError) as caught:
        port_remnants.orphans(Kernel(), socket.AF_INET, 1)  # type: ignore[arg-type]
    assert caught.value.errno == errno.EOPNOTSUPP


def test_nothing_is_destroyed_while_a_socket_listens_on_the_port() -> None:
    port = squat_and_leave(socket.AF_INET, "127.0.0.1")
    with socket.socket(socket.AF_INET6) as live:
        live.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        live.bind(("::1", port))
        live.listen()
        assert port_remnants.destroy_orphans(port) == 0
    assert bind_error(socket.AF_INET, "127.0.0.1", port) == errno.EADDRINUSE  # still there
    assert port_remnants.destroy_orphans(port) == 1


def test_a_refused_destroy_raises_with_the_kernels_errno() -> None:
    """Without ``CAP_NET_ADMIN`` the dump still finds the remnant; its destruction is refused."""
    port = squat_and_leave(socket.AF_INET, "127.0.0.1")
    script = (
        "from sandboxd import port_remnants\n"
        "try:\n"
        f"    port_remnants.destroy_closing({port})\n"
        "except OSError as e:\n"
        "    print(e.errno, e.strerror)\n"
    )
    without = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin"]
    done = subprocess.run(
        [*without, sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == f"{errno.EPERM} SOCK_DESTROY: {os.strerror(errno.EPERM)}\n", done
    assert bind_error(socket.AF_INET, "127.0.0.1", port) == errno.EADDRINUSE  # still there
    assert port_remnants.destroy_orphans(port) == 1
