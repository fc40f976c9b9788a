"""The servers under test, each a process of its own on a free loopback port.

- sandboxd: ``twistd -n sandboxd`` from this checkout, isolated (root, cgroups) or
  ``--isolation=none``, with its state root in ``/tmp/sandboxd-bench`` and a uid range of its
  own (never the default one, which test daemons on this machine use);
- the peer: SWE-ReX's ``swerex-remote`` from its own virtualenv (``bench/.venv-swerex``,
  created on first use).

Every process started here is stopped by its pid, never by name.
"""

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
STATE_ROOTS = Path("/tmp/sandboxd-bench")
SWEREX_VENV = BENCH / ".venv-swerex"
SWEREX_PACKAGE = "swe-rex"

ISOLATED_UIDS = (610000, 612499)
"""The isolated daemon's uid pool: 2500 uids, away from the default 200000-201999."""
FLOOR_UID = 612999
"""The uid the wrapper floor runs ``true`` as (outside every daemon's pool)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_kib(pid: int, field: str = "VmRSS") -> int:
    """A ``kB`` field of ``/proc/PID/status`` (0 when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak(pid: int) -> bool:
    """Reset the process's ``VmHWM`` (``clear_refs`` 5; root, Linux 4.0+)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 5) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def wait_until_up(
    process: subprocess.Popen[bytes], url: str, log: Path, headers: dict[str, str] | None = None
) -> None:
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: exited {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            if get(url, headers) == 200:
                return
        if time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"{url}: did not answer in 60 s: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def stop(process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM (a daemon drains), then SIGKILL after ``timeout``; by pid only."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Server:
    """One running server process."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.name = name
        self.process = process
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        self.root: Path | None = None
        self.headers: dict[str, str] = {}

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_kib(self) -> int:
        return status_kib(self.pid)

    def stop(self) -> None:
        stop(self.process)
        if self.root is not None and self.root.parent == STATE_ROOTS:
            shutil.rmtree(self.root, ignore_errors=True)


def start_sandboxd(
    name: str,
    isolated: bool,
    workdir: Path,
    settings: dict[str, str] | None = None,
    root: Path | None = None,
) -> Server:
    """``twistd -n sandboxd`` on a free loopback port (``settings``: more ``SANDBOXD_*``), its
    state root a fresh directory (or ``root``, made by the caller and left to it)."""
    port = free_port()
    if root is None and os.geteuid() == 0:
        STATE_ROOTS.mkdir(mode=0o711, exist_ok=True)
        STATE_ROOTS.chmod(0o711)
        root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=STATE_ROOTS))
        root.chmod(0o711)
    elif root is None:
        root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    log = workdir / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env["PYTHONPATH"] = str(REPO)
    env["SANDBOXD_UID_MIN"], env["SANDBOXD_UID_MAX"] = (str(u) for u in ISOLATED_UIDS)
    env["SANDBOXD_TOOLS_DIR"] = str(root / ".tools")
    env.update(settings or {})
    argv = [
        str(Path(sys.executable).parent / "twistd"),
        "--nodaemon",
        "--pidfile=",
        "sandboxd",
        f"--listen=tcp:{port}:interface=127.0.0.1",
        f"--root={root}",
        f"--isolation={'auto' if isolated else 'none'}",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(name, process, port, log)
    server.root = root
    wait_until_up(process, server.url + "/readyz", log)
    return server


def swerex_program(setup: bool, quiet: bool = True) -> Path | None:
    """``swerex-remote`` of ``bench/.venv-swerex``, installing it there first if asked."""
    program = SWEREX_VENV / "bin" / "swerex-remote"
    if program.exists():
        return program
    if not setup:
        return None
    output = subprocess.DEVNULL if quiet else None
    try:
        subprocess.run([sys.executable, "-m", "venv", str(SWEREX_VENV)], check=True, timeout=120)
        subprocess.run(
            [str(SWEREX_VENV / "bin" / "pip"), "install", "-q", SWEREX_PACKAGE],
            check=True,
            timeout=600,
            stdout=output,
            stderr=output,
        )
    except (OSError, subprocess.SubprocessError) as e:
        print(f"bench: cannot install {SWEREX_PACKAGE} into {SWEREX_VENV}: {e}", file=sys.stderr)
        return None
    return program if program.exists() else None


def swerex_version() -> str | None:
    pip = SWEREX_VENV / "bin" / "pip"
    try:
        out = subprocess.run(
            [str(pip), "list", "--format=json"], capture_output=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for package in json.loads(out):
        if package["name"].lower() in ("swe-rex", "swe_rex"):
            return str(package["version"])
    return None


def start_swerex(program: Path, workdir: Path) -> Server:
    """``swerex-remote`` on a free loopback port, with a fresh token."""
    port = free_port()
    token = secrets.token_hex(16)
    log = workdir / "swerex.log"
    argv = [str(program), "--host", "127.0.0.1", "--port", str(port), "--auth-token", token]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    server = Server("swerex", process, port, log)
    server.headers = {"X-API-Key": token}
    wait_until_up(process, server.url + "/is_alive", log, server.headers)
    return server


def describe(server: Server) -> dict[str, Any]:
    return {"name": server.name, "pid": server.pid, "url": server.url}
