"""The host's filesystem sockets and run-time directories (docs/isolation.rst, "What of the host
a sandbox sees"), tried for real: a sandbox in network mode ``none`` reaches for host services
through ``/dev/log``, the system bus's socket and ``/run/lock``.

As root with real isolation (cgroup v1 here; nothing of it depends on the cgroup version or the
kernel's). The test listens itself (the system bus's path and ``/dev/log`` where nothing does
yet, else a path of its own in ``/run``), so that there is something to reach. Each attack runs
against a daemon with every namespace layer on (refused, and the test's listener hears nothing)
and against one with the mount layer turned off by name (``--namespaces=ipc,net``: still its
own network, as mode ``none`` gives): there it succeeds, proof that the test can fail. The same
private ``/run`` and allow-listed ``/dev`` are checked for each way the namespaces are made (the
helper, its server, the shell chain).
"""

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.kernel.kernel_http import Box, KernelDaemon
from tests.kernel.kernel_ns import (
    CREATORS,
    RID,
    create,
    every_layer,
    make_creator,
    on_and_off,
    run_in,
    shared_root,
)

pytestmark = [pytest.mark.kernel]

BUS = "/run/dbus/system_bus_socket"
LOG = "/dev/log"
MARKER = f"<13>sandboxd-test-{os.getpid()}: forged"

PROBE = r"""
import socket, sys
for arg in sys.argv[2:]:
    kind, path = arg.split("=", 1)
    family = socket.SOCK_DGRAM if kind == "dgram" else socket.SOCK_STREAM
    client = socket.socket(socket.AF_UNIX, family)
    client.settimeout(5)
    try:
        client.connect(path)
        client.sendall(sys.argv[1].encode())
        print("reached", path)
    except OSError as e:
        print("unreached", path, e.errno)
"""


class Listeners:
    """Unix-socket listeners of the test's own (mode 0666, as the system's are), removed with
    whatever directory was made for them."""

    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.sockets: dict[str, socket.socket] = {}

    def listen(self, path: str, kind: int) -> None:
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.mkdir(parent, 0o755)
            self.stack.callback(os.rmdir, parent)
        server = socket.socket(socket.AF_UNIX, kind)
        self.stack.callback(server.close)
        server.bind(path)
        self.stack.callback(os.unlink, path)
        os.chmod(path, 0o666)
        if kind == socket.SOCK_STREAM:
            server.listen(8)
        server.settimeout(2)
        self.sockets[path] = server

    def heard(self, path: str) -> str:
        """What a client sent to ``path`` ('' when none came)."""
        server = self.sockets[path]
        try:
            if server.type == socket.SOCK_DGRAM:
                return server.recv(4096).decode()
            conn, _ = server.accept()
            with conn:
                conn.settimeout(2)
                return conn.recv(4096).decode()
        except TimeoutError:
            return ""


@contextmanager
def listening() -> Iterator[tuple[Listeners, dict[str, str]]]:
    """The test's listeners, and the paths a probe tries (``stream``/``dgram`` by path): the
    system bus's and ``/dev/log`` where nothing is there yet, else one of its own in ``/run``
    (a real syslog or bus is never written to)."""
    if os.geteuid() != 0:
        pytest.skip("listening in /run and /dev needs root")
    with ExitStack() as stack:
        found = Listeners(stack)
        own = f"/run/sandboxd-test-{os.getpid()}"
        paths = {
            BUS if not os.path.lexists(BUS) else f"{own}-bus": "stream",
            LOG if not os.path.lexists(LOG) else f"{own}-log": "dgram",
        }
        for path, kind in paths.items():
            found.listen(path, socket.SOCK_DGRAM if kind == "dgram" else socket.SOCK_STREAM)
        yield found, paths


@pytest.fixture(scope="module")
def listeners() -> Iterator[tuple[Listeners, dict[str, str]]]:
    """:func:`listening` for a module: its sockets are there before any sandbox is made."""
    with listening() as found:
        yield found


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, KernelDaemon]]:
    with on_and_off(tmp_path_factory, "run", (), ("--namespaces=ipc,net",), uids=2) as pair:
        yield pair


def probe(box: Box, paths: dict[str, str]) -> list[str]:
    argv = ["python3", "-c", PROBE, MARKER, *(f"{kind}={path}" for path, kind in paths.items())]
    result = box.exec(argv)
    assert result.exit == 0, result
    return result.text.splitlines()


@pytest.mark.parametrize("layer", ["on", "off"])
def test_host_sockets_from_network_none(daemons: dict[str, KernelDaemon], layer: str) -> None:
    """The listeners are made after the sandbox (a syslog daemon started, or restarted, later:
    covering the socket that was there at create would not do)."""
    box = daemons[layer].create("none")
    try:
        with listening() as (found, paths):
            lines = probe(box, paths)
            heard = {path: found.heard(path) for path in paths}
    finally:
        box.kill()
    for line, path in zip(lines, paths, strict=True):
        if layer == "on":
            assert line.startswith(f"unreached {path} "), lines
            assert heard[path] == "", heard
        else:
            assert line == f"reached {path}", lines
            assert heard[path] == MARKER, heard


@pytest.mark.parametrize("layer", ["on", "off"])
def test_run_lock_is_each_sandboxs_own(daemons: dict[str, KernelDaemon], layer: str) -> None:
    name = f"sandboxd-test-{os.getpid()}-{layer}"
    host = Path("/run/lock") / name
    writer, reader = daemons[layer].create("none"), daemons[layer].create("none")
    try:
        writer.ok(f"echo mine > /run/lock/{name} && chmod 644 /run/lock/{name}")
        seen = reader.run(f"cat /run/lock/{name}")
        assert ("mine" in seen.text) == (layer == "off"), seen
        assert host.exists() == (layer == "off")
        listing = writer.ok("ls -A /run; stat -f -c %T /run")
        if layer == "on":  # nothing of the host's /run: only lock/, on a tmpfs of its own
            assert listing.split() == ["lock", "tmpfs"], listing
    finally:
        writer.kill()
        reader.kill()
        host.unlink(missing_ok=True)


def test_abstract_sockets_are_the_network_namespaces(daemons: dict[str, KernelDaemon]) -> None:
    """An abstract unix socket of the host is out of reach of mode ``none`` (its own network
    namespace), and reached from a ``host`` sandbox (the host's)."""
    name = f"sandboxd-test-{os.getpid()}-abstract"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(8)
    code = (
        "import socket, sys\n"
        "c = socket.socket(socket.AF_UNIX)\n"
        "try:\n    c.connect('\\0' + sys.argv[1]); print('reached')\n"
        "except OSError as e:\n    print('unreached', e.errno)\n"
    )
    try:
        for mode in ("none", "host"):
            box = daemons["on"].create(mode)
            try:
                seen = box.exec(["python3", "-c", code, name])
            finally:
                box.kill()
            assert seen.exit == 0, seen
            assert (seen.text == "reached") == (mode == "host"), (mode, seen)
    finally:
        server.close()


@pytest.mark.parametrize("which", CREATORS)
def test_every_way_gives_a_private_run(
    listeners: tuple[Listeners, dict[str, str]], which: str
) -> None:
    """Made by the helper, its server or the shell chain, a sandbox's ``/run`` is a tmpfs of
    its own with only ``lock/`` (mode 1777) and its ``/dev`` one holding the allowed devices
    only (which work), where the test's listeners, made before the sandbox, are absent and
    ``/dev/log`` is no socket; ``/etc/resolv.conf`` reads as the host's."""
    _, paths = listeners
    with shared_root("run-") as root:
        ns = every_layer(root, which)
        try:
            ns.prepare()
            create(ns, root)
            script = (
                "stat -f -c %T /run; stat -c %a /run /run/lock; ls -A /run | tr '\\n' ,; echo;"
                " [ -S /dev/log ] && echo log-socket || echo no-log-socket;"
                " ls -A /dev | tr '\\n' ,; echo; stat -f -c %T /dev;"
                " echo out > /dev/stdout; head -c 4 /dev/urandom | wc -c;"
                + "".join(f" [ -S {p} ] && echo socket || echo none;" for p in paths)
                + " cat /etc/resolv.conf | md5sum"
            )
            out = run_in(ns, RID, which, script)
        finally:
            ns.remove(RID)
            ns.close()
    *lines, resolv = out.splitlines()
    # mount(8), which the shell chain runs, keeps its table in /run/mount (empty, root's).
    listing = "lock,mount," if which == "shell" else "lock,"
    devices = {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm"}
    devices |= {"fd", "stdin", "stdout", "stderr"} | ({"mqueue"} & set(os.listdir("/dev")))
    assert lines[:5] == ["tmpfs", "755", "1777", listing, "no-log-socket"], out
    assert set(lines[5].rstrip(",").split(",")) == devices, out
    assert lines[6:] == ["tmpfs", "out", "4", "none", "none"], out
    host = subprocess.run(
        "cat /etc/resolv.conf | md5sum", shell=True, capture_output=True, text=True, check=True
    )
    assert resolv == host.stdout.strip()
    assert stat.S_ISDIR(os.lstat("/run/lock").st_mode)  # the host's own, untouched


STUB = "/run/systemd/resolve/stub-resolv.conf"
STUB_TEXT = "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch sandboxd-test.invalid\n"

RESOLV_LINKED = r"""
set -e
root=$1; shift
mount -t tmpfs -o size=1m,mode=0755 run /run
mkdir -p /run/systemd/resolve /run/lock
printf '%s' "$STUB_TEXT" > /run/systemd/resolve/stub-resolv.conf
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
  /run/systemd/resolve/io.systemd.Resolve
mkdir "$root/upper" "$root/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$root/upper,workdir=$root/work" /etc
ln -sf ../run/systemd/resolve/stub-resolv.conf /etc/resolv.conf
exec "$@"
"""


def inside_a_linked_resolv(which: str, root: str) -> None:
    """In a mount namespace where ``/etc/resolv.conf`` links to systemd-resolved's stub file
    (beside its varlink socket), made by :func:`test_a_resolv_conf_linked_into_run`: a
    sandbox's ``/etc/resolv.conf`` reads the stub's text, and the socket stays out of sight."""
    ns = every_layer(Path(root), which)
    try:
        ns.prepare()
        create(ns, Path(root))
        out = run_in(
            ns,
            RID,
            which,
            "cat /etc/resolv.conf; ls -A /run/systemd/resolve; stat -c %a /run/systemd",
        )
        assert out == STUB_TEXT + "stub-resolv.conf\n755\n", out
    finally:
        ns.remove(RID)
        ns.close()


@pytest.mark.parametrize("which", CREATORS)
def test_a_resolv_conf_linked_into_run(which: str) -> None:
    """Where ``/etc/resolv.conf`` links into ``/run`` (systemd-resolved), names still resolve
    in a sandbox: the file is bound at its place in the sandbox's ``/run``, alone (in a
    throw-away mount namespace of the test's, where ``/etc`` is an overlay holding the link)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    make_creator(which)
    with shared_root("resolv-") as root:
        call = f"from {__name__} import inside_a_linked_resolv as f; f({which!r}, {str(root)!r})"
        done = subprocess.run(
            [
                # One CPU: the kernel pins a mount namespace numbered above the pinner's only,
                # and numbers them per CPU (the helper moves between CPUs; unshare(1) cannot).
                "taskset",
                "-c",
                str(min(os.sched_getaffinity(0))),
                "unshare",
                "--mount",
                "--propagation=private",
                "sh",
                "-c",
                RESOLV_LINKED,
                "sh",
                str(root),
                sys.executable,
                "-c",
                call,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "STUB_TEXT": STUB_TEXT},
            cwd=Path(__file__).resolve().parents[2],
        )
    assert done.returncode == 0, done.stderr[-3000:]
