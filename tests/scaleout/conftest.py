"""Three real daemons behind a real HAProxy that plays the Kubernetes ClusterIP Service.

Each replica is ``twistd -n sandboxd --isolation=none`` with a root of its own on a free
127.0.0.1 port (``tests.support.daemon.start_daemon``), all sharing one bearer token. HAProxy
(Debian's package, run in the foreground with a generated configuration) balances round robin
and health-checks ``GET /readyz`` every 200 ms, as a readiness probe would (two failures take a
replica out). Its admin socket tells the tests which replicas it considers up and how many
requests went through it.
"""

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, free_port, start_daemon, stop_daemon

REPLICAS = 3
TOKEN = "scaleout-test-token"


def haproxy_binary() -> str:
    """Debian's haproxy, or skip (not root: cannot install it) / fail (root: tests/run should)."""
    found = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/bin/haproxy") if os.access(p, os.X_OK)), None
    )
    if found is not None:
        return found
    if os.geteuid() != 0:
        pytest.skip(
            "haproxy is not installed (as root, tests/run installs it: apt-get install haproxy)"
        )
    pytest.fail("haproxy is not installed: tests/run installs it when run as root")


class Balancer:
    """A running HAProxy in front of the replicas, with its admin socket."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, admin: Path, log: Path):
        self.process = process
        self.port = port
        self.admin = admin
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.admin))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def stats(self) -> list[dict[str, str]]:
        text = self.command("show stat").lstrip("# ")
        return list(csv.DictReader(io.StringIO(text)))

    def server_status(self) -> dict[str, str]:
        """``{server name: "UP" | "DOWN" | …}`` of the replicas backend."""
        return {
            row["svname"]: row["status"]
            for row in self.stats()
            if row["pxname"] == "replicas" and row["svname"] not in ("BACKEND", "FRONTEND")
        }

    def frontend_requests(self) -> int:
        """HTTP requests the balancer received (health checks are not among them)."""
        for row in self.stats():
            if row["pxname"] == "sandboxd" and row["svname"] == "FRONTEND":
                return int(row["req_tot"] or 0)
        raise AssertionError("no frontend in haproxy stats")


def haproxy_config(port: int, admin: Path, replicas: list[Daemon]) -> str:
    servers = "\n".join(f"    server r{i} 127.0.0.1:{d.port} check" for i, d in enumerate(replicas))
    return f"""\
global
    maxconn 256
    stats socket {admin} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 2
    option redispatch

frontend sandboxd
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    timeout check 5s
    default-server inter 200ms fall 2 rise 1
{servers}
"""


def start_balancer(directory: Path, replicas: list[Daemon]) -> Balancer:
    binary = haproxy_binary()
    port = free_port()
    admin = directory / "admin.sock"
    config = directory / "haproxy.cfg"
    config.write_text(haproxy_config(port, admin, replicas))
    subprocess.run(
        [binary, "-c", "-q", "-f", str(config)], check=True, timeout=30, capture_output=True
    )
    log = directory / "haproxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [binary, "-db", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    balancer = Balancer(process, port, admin, log)
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise AssertionError(f"haproxy exited {process.returncode}: {log.read_text()}")
        try:
            if set(balancer.server_status().values()) == {"UP"}:
                return balancer
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_balancer(balancer)
            raise AssertionError(f"haproxy did not see every replica up: {log.read_text()}")
        time.sleep(0.05)


def stop_balancer(balancer: Balancer) -> None:
    if balancer.process.poll() is None:
        balancer.process.send_signal(signal.SIGTERM)
        try:
            balancer.process.wait(10)
        except subprocess.TimeoutExpired:
            balancer.process.kill()
            balancer.process.wait()


class Cluster:
    """The replicas and their balancer."""

    def __init__(self, replicas: list[Daemon], balancer: Balancer, token: str):
        self.replicas = replicas
        self.balancer = balancer
        self.token = token

    def replica_of(self, pod_url: str) -> int:
        for i, daemon in enumerate(self.replicas):
            if daemon.url == pod_url.rstrip("/"):
                return i
        raise AssertionError(f"{pod_url} is none of the replicas")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    haproxy_binary()  # skip early, before starting daemons
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    replicas: list[Daemon] = []
    balancer: Balancer | None = None
    try:

        def start(i: int) -> Daemon:
            directory = tmp_path / f"r{i}"
            directory.mkdir()
            return start_daemon(
                directory,
                "--isolation=none",
                f"--token-file={token_file}",
                "--drain-deadline=30s",
                "--keepalive=1s",
            )

        # In parallel: each start is mostly Python importing Twisted.
        with ThreadPoolExecutor(REPLICAS) as pool:
            starting = [pool.submit(start, i) for i in range(REPLICAS)]
        errors = [future.exception() for future in starting]
        replicas.extend(f.result() for f, e in zip(starting, errors, strict=True) if e is None)
        for error in errors:
            if error is not None:
                raise error
        (tmp_path / "lb").mkdir()
        balancer = start_balancer(tmp_path / "lb", replicas)
        yield Cluster(replicas, balancer, TOKEN)
    finally:
        if balancer is not None:
            stop_balancer(balancer)
        for daemon in replicas:
            stop_daemon(daemon)
