"""Real daemons over real TCP: ``twistd -n sandboxd`` started as a subprocess per test."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.uids import UNISOLATED_BLOCK, uid_block

REPO = Path(__file__).resolve().parents[2]
SHARED_ROOTS = Path("/tmp/sandboxd-tests")
SLOW = 8 if os.environ.get("SANDBOXD_VM") == "1" else 1
"""Factor for start-up and stop deadlines: in the software-emulated VM of tests/vm/run.sh,
importing Twisted alone can take longer than a daemon gets on the host."""


TWISTD = str(Path(sys.executable).parent / "twistd")
"""The ``twistd`` of this interpreter's environment (the one the tree's packages are in)."""


def daemon_argv(*args: str) -> list[str]:
    """The command line of a test's daemon: ``twistd -n sandboxd`` with ``args`` (sandboxd's
    options), in the foreground and without a pid file."""
    return [TWISTD, "--nodaemon", "--pidfile=", "sandboxd", *args]


def daemon_environ(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a test's daemon: the caller's without its ``SANDBOXD_*`` settings,
    this tree as ``PYTHONPATH``, then ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """A running ``twistd -n sandboxd`` and a tiny synchronous HTTP helper for it."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        root: Path,
        log: Path,
        token_file: str | None = None,
    ):
        self.process = process
        self.port = port
        self.root = root
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        self.token_file = token_file
        """The daemon's ``--token-file`` (or ``SANDBOXD_TOKEN_FILE``), for :func:`stop_daemon`."""

    def call(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, bytes]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, method: str, path: str, body: Any = None) -> Any:
        status, data = self.call(method, path, body)
        assert status == 200, (status, data)
        return json.loads(data)

    def create(self) -> str:
        return str(self.json("POST", "/sandboxes", {})["remote_id"])

    def inotify_instances(self) -> int:
        """The inotify descriptors the daemon holds open now."""
        fds = Path(f"/proc/{self.process.pid}/fd")
        count = 0
        for fd in fds.iterdir():
            try:
                count += os.readlink(fd) == "anon_inode:inotify"
            except OSError:
                continue  # closed while looked at
        return count

    def rss_kib(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(field)


def reachable_root(tmp_path: Path, name: str = "root") -> Path:
    """A state root for a daemon started by a test: ``tmp_path/name``, except as root, where
    sandbox uids must pass through every directory above it and pytest's temporary directories
    are private to root (0700): it is then made beneath :data:`SHARED_ROOTS` and linked from
    ``tmp_path/name`` for the test to find it. The resolved path."""
    root = tmp_path / name
    if os.geteuid() == 0 and not root.exists():
        SHARED_ROOTS.mkdir(mode=0o711, exist_ok=True)
        SHARED_ROOTS.chmod(0o711)
        real = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=SHARED_ROOTS))
        real.chmod(0o711)
        root.symlink_to(real)
    return root.resolve()


def unisolated_uids(args: Sequence[str]) -> list[str]:
    """The uid options a daemon started with ``args`` needs besides them: as root, a daemon
    with ``--isolation=none`` gives each sandbox a uid of its pool (and kills what runs as a
    uid it releases), so, unless ``args`` name its range, it gets a block no other daemon of
    the run has."""
    if os.geteuid() != 0 or "--isolation=none" not in args:
        return []
    if any(arg.startswith(("--uid-min", "--uid-max")) for arg in args):
        return []
    low, high = uid_block(UNISOLATED_BLOCK)
    return [f"--uid-min={low}", f"--uid-max={high}"]


def start_daemon(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    wrapper: tuple[str, ...] = (),
) -> Daemon:
    """Start ``twistd -n sandboxd`` on a free port; its state root is ``tmp_path/root``.

    ``wrapper`` comes before ``twistd`` on the command line (e.g. ``prlimit --nofile=…``,
    which then execs the daemon: the process is the daemon's).

    pytest's temporary directories are private to root (0700), which sandbox uids cannot
    pass through; as root, the state root is therefore made beneath ``/tmp/sandboxd-tests``
    (linked from ``tmp_path/root`` for the test to find it).
    """
    port = free_port()
    root = reachable_root(tmp_path)
    args = (*unisolated_uids(args), *args)
    log = tmp_path / "daemon.log"
    # Tests stop their daemons with SIGTERM: without a grace a drain ends as soon as no command
    # runs, as fast as a stop was before SANDBOXD_DRAIN_IDLE (the drain tests set their own).
    environ = daemon_environ({"SANDBOXD_DRAIN_IDLE": "0s", **(env or {})})
    argv = [
        *wrapper,
        *daemon_argv(f"--listen=tcp:{port}:interface=127.0.0.1", f"--root={root}", *args),
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environ)
    daemon = Daemon(process, port, root, log, token_file_of(args, environ))
    deadline = time.monotonic() + 30 * SLOW
    while True:
        if process.poll() is not None:
            raise AssertionError(f"daemon exited {process.returncode}: {log.read_text()}")
        try:
            if daemon.call("GET", "/healthz")[0] == 200:
                return daemon
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"daemon did not answer: {log.read_text()}")
        time.sleep(0.05)


def token_file_of(args: tuple[str, ...], environ: dict[str, str]) -> str | None:
    """The token file a daemon started with ``args`` and ``environ`` reads."""
    for arg in args:
        if arg.startswith("--token-file="):
            return arg.split("=", 1)[1] or None
    return environ.get("SANDBOXD_TOKEN_FILE") or None


def drain(daemon: Daemon) -> bool:
    """Stop the daemon by ``POST /drain`` and wait for its exit; False if it cannot be asked
    (gone, another address, a token it does not take) or does not exit in time.

    A drained daemon stops its reactor and exits normally, so the coverage data of its process
    is saved; one stopped by SIGTERM is not measured (twistd ends by re-raising the signal).
    """
    headers = {}
    if daemon.token_file is not None:
        try:
            headers["Authorization"] = "Bearer " + Path(daemon.token_file).read_text().strip()
        except OSError:
            return False
    request = urllib.request.Request(daemon.url + "/drain", method="POST", headers=headers)
    try:
        urllib.request.urlopen(request, timeout=10 * SLOW).close()
        daemon.process.wait(30 * SLOW)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


def stop_daemon(daemon: Daemon) -> None:
    """Stop the daemon (``POST /drain``, else SIGTERM: either way it drains), and remove a
    state root made for it in /tmp."""
    if daemon.process.poll() is None and not drain(daemon):
        daemon.process.send_signal(signal.SIGTERM)
        try:
            daemon.process.wait(30 * SLOW)
        except subprocess.TimeoutExpired:
            daemon.process.kill()
            daemon.process.wait()
    if daemon.root.parent == SHARED_ROOTS:
        shutil.rmtree(daemon.root, ignore_errors=True)
