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
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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


class Scene:
    """Namespaces, veths and servers made by one test, all removed by :meth:`close`.

    Namespaces are pinned by ``unshare --net=FILE`` in a directory of the scene's own (bound
    onto itself with private propagation, as ``ip netns`` does for ``/run/netns``), so nothing
    depends on ``/run`` being writable (it is not in the test VM).
    """

    def __init__(self) -> None:
        self.tag = f"{os.getpid() % 100000}"
        self.dir = tempfile.mkdtemp(prefix=f"egt-{self.tag}-")
        sh("mount", "--bind", self.dir, self.dir)
        sh("mount", "--make-private", self.dir)
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.servers: list[Server] = []

    def netns(self, role: str) -> str:
        """A new network namespace, its loopback up; the path of its pin."""
        path = os.path.join(self.dir, role)
        open(path, "w").close()
        self.namespaces.append(path)
        sh("unshare", f"--net={path}", "true")
        sh("nsenter", f"--net={path}", "ip", "link", "set", "lo", "up")
        return path

    def remove_netns(self, path: str) -> None:
        """Unpin a namespace (the kernel then deletes it, and the veths inside)."""
        subprocess.run(["umount", path], capture_output=True, check=False)
        with suppress(FileNotFoundError):
            os.unlink(path)
        with suppress(ValueError):
            self.namespaces.remove(path)

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
        for path in list(self.namespaces):
            self.remove_netns(path)
        subprocess.run(["umount", self.dir], capture_output=True, check=False)
        with suppress(OSError):
            os.rmdir(self.dir)


@contextmanager
def scene() -> Iterator[Scene]:
    s = Scene()
    try:
        yield s
    finally:
        s.close()
