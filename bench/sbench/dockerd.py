"""Docker as a peer: Debian's ``docker.io``, a daemon of the bench's own, an imported image.

- ``dockerd`` comes from Debian's ``docker.io`` package, installed by a full run when missing
  (``apt-get install --no-install-recommends``, never upgrading what is installed, with the
  package's init script kept from starting the system's daemon).
- The daemon is started for the run and stopped at its end: its data root (the image store) in
  ``/var/cache/sandboxd-bench/docker``, its exec root and socket in the run's temporary
  directory, no iptables rules, no bridge (``--iptables=false --bridge=none``), its containers'
  cgroups beneath this process's own (``--cgroup-parent``). No other docker daemon is touched.
- The image is a debootstrap rootfs (``minbase`` + ``python3-minimal``, from the machine's Debian
  mirror) imported with ``POST /images/create?fromSrc=-`` (``docker import``): no registry.
- :class:`Engine` speaks the Engine API over the unix socket as docker-py does: JSON requests on
  a kept-alive connection, ``exec`` start on a connection of its own upgraded to a raw stream.

A quick run (CI) never installs or bootstraps anything: it uses Docker only when ``dockerd`` and
the cached image are both there already.
"""

import contextlib
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

CACHE = Path("/var/cache/sandboxd-bench")
DATA_ROOT = CACHE / "docker"
ROOTFS_TAR = CACHE / "bookworm-python3.tar"
IMAGE_READY = CACHE / "docker-image-ready"
"""Written after a successful import (the image's id): a quick run's proof that it is cached."""
REPO, TAG = "sandboxd-bench/bookworm", "python3"
IMAGE = f"{REPO}:{TAG}"
PACKAGE = "docker.io"
POLICY_RC = Path("/usr/sbin/policy-rc.d")
LABEL = "sandboxd-bench"
START_TIMEOUT = 60.0


def dockerd_program() -> str | None:
    return shutil.which("dockerd", path="/usr/sbin:/usr/bin:/sbin:/bin")


def unavailable(setup: bool) -> str | None:
    """Why Docker's rows cannot run here (``None``: they can), installing it when ``setup``."""
    if os.geteuid() != 0:
        return "not root (dockerd needs root)"
    if dockerd_program() is None:
        if not setup:
            return f"dockerd not installed (a quick run never installs {PACKAGE}: run bench/run)"
        problem = install()
        if problem is not None:
            return problem
    if not setup and not IMAGE_READY.exists():
        return f"the image {IMAGE} is not cached (a quick run never builds it: run bench/run)"
    return None


def install() -> str | None:
    """``apt-get install docker.io`` without recommends; the reason when it fails."""
    made_policy = False
    if not POLICY_RC.exists():
        # The package's init script would start the system's dockerd (with its bridge and
        # iptables rules): policy-rc.d's 101 tells invoke-rc.d not to.
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
        made_policy = True
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "--no-upgrade", PACKAGE],
        ):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                return f"{' '.join(argv[:2])} {PACKAGE} failed: {done.stderr.strip()[-300:]}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot install {PACKAGE}: {e}"
    finally:
        if made_policy:
            POLICY_RC.unlink(missing_ok=True)
    return None if dockerd_program() else f"{PACKAGE} installed but no dockerd found"


def debian_mirror() -> str:
    """The machine's Debian mirror (apt's sources), else deb.debian.org."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    listing = Path("/etc/apt/sources.list")
    if listing.exists():
        for line in listing.read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[0] == "deb" and "security" not in parts[1]:
                return parts[1]
    return "http://deb.debian.org/debian"


def rootfs_tar() -> Path:
    """The cached tarball of a ``minbase`` bookworm with ``python3-minimal`` (made once)."""
    if ROOTFS_TAR.exists():
        return ROOTFS_TAR
    CACHE.mkdir(parents=True, exist_ok=True)
    if shutil.which("debootstrap") is None:
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            check=True,
            capture_output=True,
            timeout=600,
        )
    rootfs = CACHE / "rootfs.partial"
    shutil.rmtree(rootfs, ignore_errors=True)
    argv = ["debootstrap", "--variant=minbase", "--include=python3-minimal", "bookworm"]
    subprocess.run([*argv, str(rootfs), debian_mirror()], check=True, capture_output=True)
    partial = ROOTFS_TAR.with_suffix(".partial")
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
    partial.rename(ROOTFS_TAR)
    shutil.rmtree(rootfs, ignore_errors=True)
    return ROOTFS_TAR


def own_cgroup(controller: str = "memory") -> str:
    """This process's cgroup path in a v1 ``controller`` (the delegated subtree)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


class UnixConnection(http.client.HTTPConnection):
    """``http.client`` over a unix socket (requests' unix adapter, as docker-py uses it)."""

    def __init__(self, path: str, timeout: float = 120) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class EngineError(RuntimeError):
    pass


class Engine:
    """The Engine API calls docker-py makes for ``containers.run(detach=True)``,
    ``exec_run`` and ``remove(force=True)``, one kept-alive connection per instance."""

    def __init__(self, socket_path: str, version: str = "1.41") -> None:
        self.socket_path = socket_path
        self.prefix = f"/v{version}"
        self.conn: UnixConnection | None = None

    def request(
        self, method: str, path: str, payload: Any = None, body: Any = None
    ) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = UnixConnection(self.socket_path)
        headers = {"Content-Type": "application/json"}
        if payload is not None:
            body = json.dumps(payload).encode()
        elif body is not None:
            headers["Content-Type"] = "application/x-tar"
        try:
            self.conn.request(method, self.prefix + path, body=body, headers=headers)
            response = self.conn.getresponse()
            data = response.read()
        except (http.client.HTTPException, OSError):
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, data

    def json(self, method: str, path: str, payload: Any = None, ok: int = 200) -> Any:
        status, data = self.request(method, path, payload)
        if status != ok:
            raise EngineError(f"{method} {path}: HTTP {status}: {data[:300]!r}")
        return json.loads(data) if data.strip() else None

    def run(self, cmd: list[str]) -> str:
        """Create and start a container of the image (network none): its id."""
        config = {
            "Image": IMAGE,
            "Cmd": cmd,
            "Tty": False,
            "OpenStdin": False,
            "AttachStdin": False,
            "AttachStdout": False,
            "AttachStderr": False,
            "Labels": {LABEL: "1"},
            "HostConfig": {"NetworkMode": "none"},
        }
        cid = str(self.json("POST", "/containers/create", config, ok=201)["Id"])
        self.json("POST", f"/containers/{cid}/start", ok=204)
        return cid

    def exec_run(self, cid: str, cmd: list[str]) -> tuple[int, bytes]:
        """Exit code and output of ``cmd`` in the container: create, start (attached), inspect."""
        spec = {
            "AttachStdin": False,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Privileged": False,
            "Cmd": cmd,
        }
        eid = self.json("POST", f"/containers/{cid}/exec", spec, ok=201)["Id"]
        output = self._exec_start(eid)
        code = self.json("GET", f"/exec/{eid}/json")["ExitCode"]
        return int(code), output

    def _exec_start(self, eid: str) -> bytes:
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        head = (
            f"POST {self.prefix}/exec/{eid}/start HTTP/1.1\r\nHost: localhost\r\n"
            "Content-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(120)
            sock.connect(self.socket_path)
            sock.sendall(head + body)
            chunks = []
            while data := sock.recv(1 << 16):
                chunks.append(data)
        reply = b"".join(chunks)
        status, _, stream = reply.partition(b"\r\n\r\n")
        if not status.startswith((b"HTTP/1.1 101", b"HTTP/1.1 200")):
            raise EngineError(f"exec start: {status[:200]!r}")
        return demultiplex(stream)

    def remove(self, cid: str) -> None:
        """``DELETE /containers/{id}?force=1``: kill and remove."""
        status, data = self.request("DELETE", f"/containers/{cid}?v=0&link=0&force=1")
        if status not in (204, 404):
            raise EngineError(f"remove {cid[:12]}: HTTP {status}: {data[:300]!r}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def demultiplex(stream: bytes) -> bytes:
    """The payloads of Docker's multiplexed stream (8-byte headers: stream, 0, 0, 0, size)."""
    out, at = [], 0
    while at + 8 <= len(stream):
        (size,) = struct.unpack(">I", stream[at + 4 : at + 8])
        out.append(stream[at + 8 : at + 8 + size])
        at += 8 + size
    return b"".join(out)


class Dockerd:
    """One ``dockerd`` of the bench's own, started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(self, workdir: Path) -> None:
        self.exec_root = workdir / "docker-exec"
        self.socket = str(workdir / "docker.sock")
        self.log = workdir / "dockerd.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.cgroup_parent = f"{own_cgroup().rstrip('/')}/sandboxd-bench-docker-{os.getpid()}"
        self.made_cgroups: list[Path] = []
        self.lock: int | None = None
        self.version = ""
        self.api = "1.41"

    def start(self) -> None:
        program = dockerd_program()
        assert program is not None
        DATA_ROOT.mkdir(parents=True, exist_ok=True)
        self.lock = os.open(CACHE / "docker.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.lock)
            self.lock = None
            raise RuntimeError(f"another bench run is using {DATA_ROOT}") from None
        self.exec_root.mkdir(parents=True, exist_ok=True)
        self._note_cgroups()
        argv = [
            program,
            f"--data-root={DATA_ROOT}",
            f"--exec-root={self.exec_root}",
            f"--host=unix://{self.socket}",
            f"--pidfile={self.exec_root / 'dockerd.pid'}",
            "--iptables=false",
            "--ip-masq=false",
            "--ip-forward=false",
            "--bridge=none",
            "--userland-proxy=false",
            f"--cgroup-parent={self.cgroup_parent}",
            "--log-level=warn",
        ]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT
        engine = Engine(self.socket, self.api)
        engine.prefix = ""
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd exited {self.process.returncode}: {self.tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException, EngineError):
                info = engine.json("GET", "/version")
                self.version, self.api = str(info["Version"]), str(info["ApiVersion"])
                engine.close()
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"dockerd did not answer in {START_TIMEOUT:g} s: {self.tail()}")
            time.sleep(0.1)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"

    def engine(self) -> Engine:
        return Engine(self.socket, self.api)

    def ensure_image(self, setup: bool) -> None:
        """Import the rootfs tarball as the image unless the daemon has it already."""
        engine = self.engine()
        try:
            status, _ = engine.request("GET", f"/images/{IMAGE}/json")
            if status == 200:
                IMAGE_READY.write_text(IMAGE + "\n")
                return
            if not setup:
                raise RuntimeError(f"the image {IMAGE} is gone from {DATA_ROOT}")
            tar = rootfs_tar()
            with open(tar, "rb") as f:
                query = f"fromSrc=-&repo={REPO}&tag={TAG}"
                status, data = engine.request("POST", f"/images/create?{query}", body=f)
            if status != 200 or b'"error' in data:
                raise RuntimeError(f"docker import: HTTP {status}: {data[-300:]!r}")
            IMAGE_READY.write_text(IMAGE + "\n")
        finally:
            engine.close()

    def remove_all(self) -> None:
        """Remove every container labelled as the bench's (an earlier run's leftovers too)."""
        engine = self.engine()
        try:
            query = urllib.parse.quote(json.dumps({"label": [LABEL]}))
            for c in engine.json("GET", f"/containers/json?all=1&filters={query}"):
                engine.remove(c["Id"])
        finally:
            engine.close()

    def pids(self) -> list[int]:
        """dockerd, its containerd, the shims of its containers and what runs in them."""
        if self.process is None:
            return []
        address = str(self.exec_root)
        roots = {self.process.pid}
        for pid, cmdline in _cmdlines().items():
            if "containerd-shim" in cmdline and address in cmdline:
                roots.add(pid)
        return descendants(roots)

    def _note_cgroups(self) -> None:
        """The parent cgroup's directories runc will make, to remove them at the end."""
        self.made_cgroups = []
        for mount in Path("/sys/fs/cgroup").iterdir():
            parts = self.cgroup_parent.strip("/").split("/")
            for depth in range(len(parts)):
                path = mount.joinpath(*parts[: depth + 1])
                if mount.is_dir() and not path.exists():
                    self.made_cgroups.append(path)

    def stop(self) -> None:
        """SIGTERM by pid (dockerd stops its containerd), then unmount and rmdir what it left."""
        if self.lock is None:
            return  # never started: the data root may be another run's
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for point in reversed(_mounts_under((self.exec_root, DATA_ROOT))):
            subprocess.run(["umount", "-l", point], capture_output=True)
        for path in sorted(self.made_cgroups, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


def _cmdlines() -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found[int(entry.name)] = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                )
    return found


def descendants(roots: set[int]) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(stat[1])
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return sorted(p for p in found if p in parents)


def pss_kib(pids: list[int]) -> int:
    """The sum of the processes' proportional set sizes (shared pages counted once in all)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
    return total


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def _mounts_under(tops: tuple[Path, ...]) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if any(point == str(t) or point.startswith(f"{t}/") for t in tops):
            points.append(point)
    return points
