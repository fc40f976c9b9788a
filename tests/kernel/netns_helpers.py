"""Network namespaces, veths and TCP servers the egress tests make for themselves (root only).

Every name made here carries the test process's pid, so parallel runs never collide, and
:class:`Scene` removes everything it made (namespaces, veths, servers) even when a test fails.
Sockets are opened inside a namespace by a thread that ``setns``-es into it and back (a socket
stays in the namespace it was made in), so no traffic ever leaves the namespaces made here or
the host's own loopback.
"""

import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest

T = TypeVar("T")

EGRESS_MARKS = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nftables need root"),
    pytest.mark.skipif(
        subprocess.run(["sh", "-c", "command -v nft"], capture_output=True).returncode != 0,
        reason="needs nft (nftables)",
    ),
]
"""The marks of every test that builds networks of its own: kernel, root, and nftables."""

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def in_netns(path: str | None, work: Callable[[], T]) -> T:
    """Run ``work()`` in a thread whose network namespace is ``path`` (``None``: the host's)."""
    result: list[T] = []
    error: list[BaseException] = []

    def thread() -> None:
        if path is None:
            result.append(work())
            return
        home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        target = os.open(path, os.O_RDONLY)
        try:
            _setns(target)
            try:
                result.append(work())
            finally:
                _setns(home)
        except BaseException as e:  # handed to the caller
            error.append(e)
        finally:
            os.close(target)
            os.close(home)

    t = threading.Thread(target=thread)
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def sh(*argv: str, stdin: str | None = None) -> str:
    """Run a command, raise with its stderr if it fails."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


class Server:
    """A TCP server that answers every connection with its ``banner`` and closes it."""

    def __init__(self, netns: str | None, address: str, banner: bytes) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET

        def make() -> socket.socket:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, 0))
            s.listen(16)
            return s

        self.sock = in_netns(netns, make)
        self.address = address
        self.port: int = self.sock.getsockname()[1]
        self.banner = banner
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.banner)

    def close(self) -> None:
        self.sock.close()


def connect(netns: str | None, address: str, port: int, timeout: float = 3.0) -> str:
    """What a connection from ``netns`` to ``address:port`` gets: the banner, or the error.

    ``"refused:<errno name>"`` when the connection fails, ``"timeout"`` when nothing answers.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    def attempt() -> str:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect((address, port))
                return s.recv(100).decode()
            except TimeoutError:
                return "timeout"
            except OSError as e:
                return f"refused:{os.strerror(e.errno or 0)}"

    return in_netns(netns, attempt)


KEEPER = "ip link set lo up && echo up && exec sleep infinity"
"""What holds a scene's namespace: its loopback up, a line to say so, then nothing, for ever."""


class Scene:
    """Namespaces, veths and servers made by one test, all removed by :meth:`close`.

    Each namespace is held by a keeper process (``unshare --net`` then ``sleep``) that the kernel
    kills when the test process dies (``setpriv --pdeathsig KILL``), and is named by
    ``/proc/<keeper>/ns/net``. A run killed mid-test (a CI job's limit, a session's end) thus
    leaves no namespace behind, nor the veths and routes into it: a pinned namespace outlived
    such a run once and went on taking the host's traffic for its addresses. Nothing depends on
    ``/run`` being writable (it is not in the test VM).
    """

    keeper_argv = ["setpriv", "--pdeathsig", "KILL", "unshare", "--net", "sh", "-c", KEEPER]
    """How a keeper starts: killed with the process that made it, in a namespace of its own."""

    def __init__(self) -> None:
        self.tag = f"{os.getpid() % 100000}"
        self.keepers: dict[str, subprocess.Popen[bytes]] = {}
        """Each namespace's keeper, by the path that names the namespace."""
        self.links: list[str] = []
        self.servers: list[Server] = []

    def netns(self, role: str) -> str:
        """A new network namespace, its loopback up; the path that names it (``role`` is for
        the reader: the namespace has no name of its own)."""
        keeper = subprocess.Popen(
            self.keeper_argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert keeper.stdout is not None
        ready = keeper.stdout.readline()
        if ready != b"up\n":
            keeper.kill()
            keeper.wait()
            raise RuntimeError(f"the {role} namespace's keeper did not start: {ready!r}")
        path = f"/proc/{keeper.pid}/ns/net"
        self.keepers[path] = keeper
        return path

    def remove_netns(self, path: str) -> None:
        """End a namespace's keeper (the kernel then deletes the namespace, and the veths
        inside)."""
        keeper = self.keepers.pop(path, None)
        if keeper is not None:
            keeper.kill()
            keeper.wait()
            if keeper.stdout is not None:
                keeper.stdout.close()

    def wire(self, role: str, netns: str, host_addrs: list[str], inside_addrs: list[str]) -> str:
        """A veth from the host (``eg{role}{tag}``) to ``eth0`` in ``netns``, addressed."""
        name = f"eg{role}{self.tag}"[:15]
        sh("ip", "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", netns)
        self.links.append(name)
        batch = "".join(f"addr add {a} dev {name} nodad\n" for a in host_addrs)
        sh("ip", "-batch", "-", stdin=batch + f"link set {name} up\n")
        inside = "".join(f"addr add {a} dev eth0 nodad\n" for a in inside_addrs)
        sh("nsenter", f"--net={netns}", "ip", "-batch", "-", stdin=inside + "link set eth0 up\n")
        return name

    def serve(self, netns: str | None, address: str, banner: str) -> Server:
        server = Server(netns, address, banner.encode())
        self.servers.append(server)
        return server

    def close(self) -> None:
        for server in self.servers:
            server.close()
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        for path in list(self.keepers):
            self.remove_netns(path)


@contextmanager
def scene() -> Iterator[Scene]:
    s = Scene()
    try:
        yield s
    finally:
        s.close()
