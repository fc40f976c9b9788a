"""The pieces of the proxy that need no daemon: dialing inside a namespace, the E2B front's
resource as twisted.web sees it."""

import os
import socket
import threading
from pathlib import Path

import pytest

from sandboxd.e2b.ports import PortHosts
from sandboxd.errors import SandboxNotFound
from sandboxd.ports.dial import PortClosed, connect_inside
from sandboxd.ports.forward import _Relay


def in_thread(pin: str, port: int) -> BaseException | socket.socket:
    """:func:`connect_inside` in a thread of its own (it may enter another namespace)."""
    result: list[BaseException | socket.socket] = []

    def work() -> None:
        try:
            result.append(connect_inside(pin, port, timeout=2))
        except BaseException as e:
            result.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return result[0]


def test_a_pin_that_is_gone_is_a_sandbox_not_found(tmp_path: Path) -> None:
    found = in_thread(str(tmp_path / "net"), 80)
    assert isinstance(found, SandboxNotFound)


def test_a_file_that_is_no_namespace_is_refused_by_the_kernel(tmp_path: Path) -> None:
    plain = tmp_path / "net"
    plain.write_text("")
    found = in_thread(str(plain), 80)
    assert isinstance(found, OSError) and "setns" in str(found)


def test_nothing_listening_is_port_closed() -> None:
    if os.geteuid() != 0:
        pytest.skip("setns needs CAP_SYS_ADMIN")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        found = in_thread("/proc/self/ns/net", port)
    assert isinstance(found, PortClosed)
    assert found.detail == f"nothing listens on port {port} inside the sandbox"


def test_the_port_hosts_resource_is_a_leaf() -> None:
    hosts = PortHosts(None, None, None)  # type: ignore[arg-type]
    assert hosts.getChildWithDefault(b"x", None) is hosts  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        hosts.putChild(b"x", hosts)


def test_a_relay_closed_before_its_answer_began_does_nothing() -> None:
    relay = _Relay(request=None)
    relay.close()  # no connection yet: nothing to stop
    assert not relay.done.called
