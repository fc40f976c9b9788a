"""One real ``twistd -n sandboxd`` for the load test, and what /proc says about it.

The daemon runs as a subprocess on a free 127.0.0.1 port, isolated (cgroups, uids) when the
test runs as root on a host with a usable cgroup hierarchy, else ``--isolation=none``
(``SANDBOXD_SOAK_ISOLATION`` forces either). Its state root is a fresh directory sandbox uids
can pass through (0711), which the fixture removes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import attrs

from sandboxd.config import Config
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.naming import instance_name, is_rid
from tests.support.daemon import daemon_argv, daemon_environ

REPO = Path(__file__).resolve().parents[2]
CGROUP_MOUNT = "/sys/fs/cgroup"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def choose_isolation() -> str:
    """``SANDBOXD_SOAK_ISOLATION``, else a cgroup driver when root and one is usable here."""
    forced = os.environ.get("SANDBOXD_SOAK_ISOLATION")
    if forced:
        return forced
    if os.geteuid() != 0:
        return "none"
    from twisted.internet.task import Clock

    from sandboxd.isolation.select import Host, choose_driver

    try:
        driver = choose_driver(Config.load({}, {"isolation": "auto"}), Clock(), Host())
    except IsolationUnavailable:
        return "none"
    return driver.name


@attrs.define
class ProcessFigures:
    """What the kernel says about one process."""

    fds: int
    rss_kib: int
    threads: int
    cpu_seconds: float
    """User and system CPU time used so far."""

    @classmethod
    def of(cls, pid: int) -> ProcessFigures:
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.split()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return cls(
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            rss_kib=int(fields["VmRSS"][0]),
            threads=int(fields["Threads"][0]),
            cpu_seconds=(int(stat[11]) + int(stat[12])) / ticks,
        )


@attrs.define
class SoakDaemon:
    """A running daemon, its settings, and the leak checks made after the load."""

    process: subprocess.Popen[bytes]
    port: int
    scratch: str
    root: str
    isolation: str
    uid_min: int
    uid_max: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def figures(self) -> ProcessFigures:
        return ProcessFigures.of(self.process.pid)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def thread_stacks(self) -> str:
        """What each of the daemon's threads is waiting in (``/proc/PID/task/*/wchan`` and
        ``stat``), for a failure report."""
        lines = []
        for task in sorted(Path(f"/proc/{self.process.pid}/task").glob("*")):
            try:
                wchan = (task / "wchan").read_text()
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                kernel_stack = (task / "stack").read_text() if os.geteuid() == 0 else ""
            except OSError as e:
                lines.append(f"{task.name}: {e}")
                continue
            lines.append(f"{task.name}: state {state}, wchan {wchan}\n{kernel_stack}")
        return "\n".join(lines)

    def leftover_directories(self) -> list[str]:
        return sorted(n for n in os.listdir(self.root) if is_rid(n))

    def instance_cgroups(self) -> list[str]:
        """This daemon's instance directories (``sandboxd-<hash>``), in every hierarchy."""
        if self.isolation == "none":
            return []
        name = instance_name(self.root)
        found = []
        for top, dirs, _ in os.walk(CGROUP_MOUNT):
            if os.path.basename(top) == name:
                found.append(top)
                dirs[:] = []
            elif top.count("/") > 8:
                dirs[:] = []
        return sorted(found)

    def leftover_cgroups(self) -> list[str]:
        """Sandbox cgroups under this daemon's instance directories, in any hierarchy."""
        return sorted(
            os.path.join(top, d)
            for top in self.instance_cgroups()
            for d in os.listdir(top)
            if is_rid(d) and os.path.isdir(os.path.join(top, d))
        )

    def stop(self) -> str:
        """SIGTERM (drain), else SIGKILL; the log's text."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.log.read_text(errors="replace")


def start_daemon(isolation: str) -> SoakDaemon:
    """Start ``twistd -n sandboxd`` and wait until ``/healthz`` answers."""
    scratch = tempfile.mkdtemp(prefix="sandboxd-soak-", dir="/tmp")
    os.chmod(scratch, 0o711)
    root = os.path.join(scratch, "root")
    log = Path(scratch) / "daemon.log"
    port = free_port()
    uid_min = 240_000 + (os.getpid() % 500) * 400
    uid_max = uid_min + 399
    environ = daemon_environ({"SANDBOXD_DRAIN_IDLE": "0s"})  # its stop kills what is left
    argv = daemon_argv(
        f"--listen=tcp:{port}:interface=127.0.0.1",
        f"--root={root}",
        f"--isolation={isolation}",
        f"--uid-min={uid_min}",
        f"--uid-max={uid_max}",
        f"--tools-dir={os.path.join(scratch, 'tools')}",
        "--memory-max=256M",
        "--pids-max=64",
        "--exec-timeout=2m",
    )
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environ)
    daemon = SoakDaemon(process, port, scratch, root, isolation, uid_min, uid_max, log)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            text = log.read_text(errors="replace")
            raise AssertionError(f"daemon ({isolation}) exited {process.returncode}:\n{text}")
        try:
            if daemon.get("/healthz")[0] == 200:
                return daemon
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"daemon did not answer:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def stray_processes(root: str, uid_min: int, uid_max: int) -> list[str]:
    """Live processes (not zombies) working under ``root`` or running as a sandbox uid."""
    prefix = os.path.realpath(root).rstrip("/") + "/"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = _status(int(name))
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        if status.get("State", "").startswith(("Z", "X")):
            continue
        uids = {int(u) for u in status.get("Uid", "").split()}
        if (cwd.rstrip("/") + "/").startswith(prefix) or any(uid_min <= u <= uid_max for u in uids):
            found.append(f"{name} {status.get('Name')} uids={sorted(uids)} cwd={cwd}")
    return found
