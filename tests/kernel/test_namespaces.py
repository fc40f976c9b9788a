"""The namespaces (docs/isolation.rst, "Namespaces"), tried for real: one sandbox attacks another
through what the host shares.

As root with real isolation (cgroup v1 here, v2 in the VM of ``tests/vm/run.sh``). Each attack
runs against a daemon with every namespace layer on (it must be refused) and against one with
the layer turned off by name, ``--namespaces=none`` or a ``host`` network sandbox (it must then
succeed: proof that the test can fail). Each daemon has two uids, handed out in FIFO order, so
a sandbox created after one is killed (while the other lives) gets the killed one's uid.
"""

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.isolation.namespaces.pins import home_coverable
from tests.kernel.kernel_http import (
    SLOW,
    Box,
    KernelDaemon,
    isolation_problem,
    uid_block,
    wait_for,
)
from tests.kernel.kernel_ns import on_and_off
from tests.support.daemon import start_daemon, stop_daemon

pytestmark = [pytest.mark.kernel]

SECRET = "victim-secret-5b1e"

SHM = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
KEY, IPC_CREAT = 0x5A5D, 0o1000
what = sys.argv[1]
if what == "squat":
    print(libc.shmget(KEY, 4096, IPC_CREAT | 0o666))
elif what == "victim":
    ident = libc.shmget(KEY, 4096, IPC_CREAT | 0o600)
    ctypes.memmove(libc.shmat(ident, None, 0), sys.argv[2].encode(), len(sys.argv[2]))
elif what == "read":
    ident = libc.shmget(KEY, 4096, 0)
    print(ctypes.string_at(libc.shmat(ident, None, 0), 64).rstrip(b"\0").decode())
elif what == "exhaust":
    made = 0
    while libc.shmget(0, 4096, IPC_CREAT | 0o600) >= 0:
        made += 1
    print(made, ctypes.get_errno())
elif what == "one":
    print(libc.shmget(0, 4096, IPC_CREAT | 0o600), ctypes.get_errno())
"""

MQUEUE = r"""
import ctypes, os, sys
libc = ctypes.CDLL("librt.so.1", use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
attr = Attr(0, 1, 1, 0)
what, prefix = sys.argv[1], sys.argv[2]
def mq_open(name):
    return libc.mq_open(name.encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
if what == "exhaust":
    made = 0
    while mq_open(f"/{prefix}-{made}") >= 0:
        made += 1
    print(made, ctypes.get_errno())
elif what == "one":
    print(mq_open(f"/{prefix}-victim"), ctypes.get_errno())
elif what == "clean":
    for i in range(4096):
        libc.mq_unlink(f"/{prefix}-{i}".encode())
    libc.mq_unlink(f"/{prefix}-victim".encode())
"""

NET = r"""
import os, socket, sys, time
kind, what, where = sys.argv[1], sys.argv[2], sys.argv[3]
family = socket.AF_UNIX if kind == "abstract" else socket.AF_INET
address = "\0" + where if kind == "abstract" else ("127.0.0.1", int(where))
if what == "serve":
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(8)
    with open("serving.tmp", "w") as f:
        f.write(where if kind == "abstract" else str(server.getsockname()[1]))
    os.rename("serving.tmp", "serving")
    while True:
        conn, _ = server.accept()
        conn.sendall(b"attacker-here")
        conn.close()
else:
    client = socket.socket(family, socket.SOCK_STREAM)
    client.settimeout(5)
    try:
        client.connect(address)
        print("reached", client.recv(64).decode())
    except OSError as e:
        print("unreached", e.errno)
    squat = socket.socket(family, socket.SOCK_STREAM)
    try:
        squat.bind(address)
        print("bound")
    except OSError as e:
        print("squatted", e.errno)
"""


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, KernelDaemon]]:
    with on_and_off(tmp_path_factory, "ns", (), ("--namespaces=none",), uids=2) as pair:
        yield pair


def pair(kd: KernelDaemon, network: str | None = None) -> tuple[Box, Box]:
    return kd.create(network), kd.create(network)


def py(box: Box, code: str, *args: str) -> str:
    result = box.exec(["python3", "-c", code, *args])
    assert result.exit == 0, result
    return result.text


def test_healthz_lists_each_layer_in_force(daemons: dict[str, KernelDaemon]) -> None:
    on = daemons["on"].call("GET", "/healthz").json()["capabilities"]
    off = daemons["off"].call("GET", "/healthz").json()["capabilities"]
    layers = {"isolation.ipc", "isolation.mount", "isolation.net", "network.none"}
    assert layers <= set(on) and "network.host" in on, on
    assert not layers & set(off) and "network.host" in off, off


@pytest.mark.parametrize("layer", ["on", "off"])
def test_sysv_shm_key_squatting(daemons: dict[str, KernelDaemon], layer: str) -> None:
    attacker, victim = pair(daemons[layer])
    try:
        py(attacker, SHM, "squat")
        py(victim, SHM, "victim", SECRET)
        stolen = py(attacker, SHM, "read")
        assert (stolen == SECRET) == (layer == "off"), stolen
    finally:
        attacker.kill()
        victim.kill()
        subprocess.run(["ipcrm", "-M", str(0x5A5D)], capture_output=True, check=False)


@pytest.mark.parametrize("layer", ["on", "off"])
def test_exhausting_shm_and_mqueue_slots(daemons: dict[str, KernelDaemon], layer: str) -> None:
    attacker, victim = pair(daemons[layer])
    prefix = f"sandboxd-test-{os.getpid()}"
    made = []
    try:
        made = [int(n) for n in py(attacker, SHM, "exhaust").split()] + [
            int(n) for n in py(attacker, MQUEUE, "exhaust", prefix).split()
        ]
        shm = py(victim, SHM, "one").split()
        mq = py(victim, MQUEUE, "one", prefix).split()
        if layer == "on":
            assert int(shm[0]) >= 0 and int(mq[0]) >= 0, (made, shm, mq)
        else:
            assert int(shm[0]) < 0 and int(shm[1]) == 28, (made, shm)  # ENOSPC
            assert int(mq[0]) < 0 and int(mq[1]) == 28, (made, mq)
    finally:
        if layer == "off":  # they outlive the sandbox: the very problem
            py(attacker, MQUEUE, "clean", prefix)
            py(attacker, "import os; os.system('ipcrm --all=shm')")
        attacker.kill()
        victim.kill()


@pytest.mark.parametrize("layer", ["on", "off"])
def test_a_file_in_tmp_or_dev_shm_is_read_by_another(
    daemons: dict[str, KernelDaemon], layer: str
) -> None:
    writer, reader = pair(daemons[layer])
    paths = [f"{place}/sandboxd-test-{os.getpid()}" for place in ("/tmp", "/var/tmp", "/dev/shm")]
    try:
        writer.ok(" && ".join(f"echo {SECRET} > {p} && chmod 644 {p}" for p in paths))
        for path in paths:
            seen = reader.run(f"cat {path}")
            assert (SECRET in seen.text) == (layer == "off"), (path, seen)
    finally:
        writer.kill()
        reader.kill()
        for path in paths:
            Path(path).unlink(missing_ok=True)


def protected_symlinks() -> bool:
    return Path("/proc/sys/fs/protected_symlinks").read_text().strip() != "0"


@pytest.mark.parametrize("layer", ["on", "off"])
def test_a_planted_symlink_redirects_another_sandboxs_write(
    daemons: dict[str, KernelDaemon], layer: str
) -> None:
    if layer == "off" and protected_symlinks():
        pytest.skip("fs.protected_symlinks=1 here: the kernel itself refuses the redirect")
    attacker, victim = pair(daemons[layer])
    loot, report = f"/tmp/sandboxd-loot-{os.getpid()}", f"/tmp/sandboxd-report-{os.getpid()}"
    try:
        attacker.ok(f": > {loot} && chmod 666 {loot} && ln -s {loot} {report}")
        victim.run(f"echo {SECRET} > {report}")
        stolen = attacker.run(f"cat {loot}").text
        assert (stolen == SECRET) == (layer == "off"), stolen
    finally:
        attacker.kill()
        victim.kill()
        for path in (loot, report):
            Path(path).unlink(missing_ok=True)


@pytest.mark.parametrize("layer", ["on", "off"])
def test_tmp_survives_kill_into_a_new_sandbox_with_the_same_uid(
    daemons: dict[str, KernelDaemon], layer: str
) -> None:
    first, other = pair(daemons[layer])
    uid = first.uid()
    paths = [f"{place}/sandboxd-left-{uid}" for place in ("/tmp", "/var/tmp", "/dev/shm")]
    second = None
    try:
        first.ok(" && ".join(f"echo private > {p}" for p in paths))
        assert first.kill().status == 204
        second = daemons[layer].create()
        assert second.uid() == uid
        found = [p for p in paths if "private" in second.run(f"cat {p}").text]
        assert found == ([] if layer == "on" else paths), found
    finally:
        for box in (other, second):
            if box is not None:
                box.kill()
        for path in paths:
            Path(path).unlink(missing_ok=True)


NET_LAYERS = [("on", None), ("off", None), ("on", "host")]


@pytest.mark.parametrize("kind", ["tcp", "abstract"])
@pytest.mark.parametrize(("layer", "network"), NET_LAYERS, ids=["none", "off", "host"])
def test_a_loopback_or_abstract_server_is_reached_and_squatted(
    daemons: dict[str, KernelDaemon], layer: str, network: str | None, kind: str
) -> None:
    attacker, victim = pair(daemons[layer], network)
    # A tcp server binds port 0 and names the port it got: a port chosen by the test could be
    # taken by any other socket on the host before the server binds it.
    asked = "0" if kind == "tcp" else f"sandboxd-test-{os.getpid()}"
    try:
        started = attacker.exec(
            [
                "sh",
                "-c",
                'python3 -c "$0" "$@" </dev/null >/dev/null 2>serve.err &',
                NET,
                kind,
                "serve",
                asked,
            ]
        )
        assert started.exit == 0, started
        assert wait_for(lambda: attacker.run("cat serving").exit == 0, 30 * SLOW), attacker.run(
            "cat serve.err"
        )
        where = attacker.ok("cat serving")
        probe = ["python3", "-c", NET, kind, "probe", where]
        shared = layer == "off" or network == "host"
        # The server is up once the attacker's own probe reaches it.
        assert wait_for(lambda: "reached" in attacker.exec(probe).text.split(), 30 * SLOW)
        seen = victim.exec(probe).text
        if shared:
            assert "reached attacker-here" in seen and "squatted 98" in seen, seen
        else:
            assert "unreached" in seen and "bound" in seen, seen
    finally:
        attacker.kill()
        victim.kill()


def ns_inode(box: Box, kind: str) -> str:
    return box.ok(f"readlink /proc/self/ns/{kind}")


def mounted_nsfs() -> str:
    return Path("/proc/self/mountinfo").read_text()


def holders(link: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/ipc") == link:
                found.append(pid)
        except OSError:
            continue
    return found


def test_ipc_objects_and_pins_go_with_the_sandbox(daemons: dict[str, KernelDaemon]) -> None:
    kd = daemons["on"]
    box = kd.create()
    py(box, SHM, "squat")
    ipc = ns_inode(box, "ipc")
    pins = kd.root / ".ns" / box.rid
    capabilities = kd.call("GET", "/healthz").json()["capabilities"]
    pid = ["init", "pid"] if "isolation.pid" in capabilities else []
    assert sorted(os.listdir(pins)) == sorted(["group", "ipc", "mnt", "net", "passwd", *pid])
    assert ipc in mounted_nsfs()
    assert box.kill().status == 204
    assert not pins.exists()
    assert box.rid not in mounted_nsfs() and ipc not in mounted_nsfs()
    # No pin and no process holds the namespace: the kernel frees it, and its segment.
    assert wait_for(lambda: not holders(ipc), 10 * SLOW), holders(ipc)


def test_ipc_objects_outlive_the_sandbox_without_the_layer(
    daemons: dict[str, KernelDaemon],
) -> None:
    box = daemons["off"].create()
    try:
        py(box, SHM, "squat")
        assert box.kill().status == 204
        shown = subprocess.run(["ipcs", "-m"], capture_output=True, text=True, check=True)
        assert "0x00005a5d" in shown.stdout
    finally:
        subprocess.run(["ipcrm", "-M", str(0x5A5D)], capture_output=True, check=False)


def test_host_mode_is_refused_when_not_allowed(tmp_path: Path) -> None:
    if isolation_problem() is not None:
        pytest.skip(str(isolation_problem()))
    kd = KernelDaemon.start(tmp_path, "--network-allow=none", uids=1)
    try:
        answer = kd.call("POST", "/sandboxes", {"network": "host"})
        assert answer.status == 400 and "host" in answer.json()["detail"], answer
        answer = kd.call("POST", "/sandboxes", {"network": "egress"})
        assert answer.status == 400 and "egress" in answer.json()["detail"], answer
        assert "network.host" not in kd.call("GET", "/healthz").json()["capabilities"]
    finally:
        kd.stop()


def test_pins_of_a_sigkilled_daemon_are_removed_by_its_successor(tmp_path: Path) -> None:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    low, high = uid_block()
    uids = ["--isolation=auto", f"--uid-min={low}", f"--uid-max={high}"]
    first = start_daemon(tmp_path, *uids)
    try:
        rid = first.create()
        assert f"/.ns/{rid}/mnt" in mounted_nsfs()
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    assert f"/.ns/{rid}/mnt" in mounted_nsfs(), "a crash leaves the pins"
    second = start_daemon(tmp_path, *uids)
    try:
        assert wait_for(lambda: f"/.ns/{rid}/" not in mounted_nsfs(), 20 * SLOW)
        assert not (second.root / ".ns" / rid).exists()
    finally:
        stop_daemon(second)
    assert f"{second.root}/.ns" not in mounted_nsfs()


@pytest.mark.parametrize("layer", ["on", "off"])
def test_the_hosts_home_is_out_of_sight_and_the_workspace_is_home_user(
    daemons: dict[str, KernelDaemon], layer: str
) -> None:
    """The host's users' homes (``/home``, often world-readable) are what a sandbox reads with
    the mount layer off; with it on, ``/home`` holds only ``user``, the sandbox's own workspace
    (the native API's cwd and ``HOME`` stay the real paths, docs/contract.rst)."""
    if not home_coverable():
        pytest.skip("this host has no /home directory to cover")
    box = daemons[layer].create()
    try:
        listed, cwd, home, seen = box.ok(
            "ls -A /home | tr '\\n' /; echo; pwd; echo $HOME; stat -c %d:%i /home/user || echo -"
        ).split("\n")[:4]
        assert cwd == str(box.workspace) and home == str(box.directory / "home")
        st = os.stat(box.workspace)
        if layer == "on":
            assert (listed, seen) == ("user/", f"{st.st_dev}:{st.st_ino}")
        else:
            assert listed == "".join(f"{name}/" for name in sorted(os.listdir("/home")))
            assert seen != f"{st.st_dev}:{st.st_ino}"
    finally:
        box.kill()
