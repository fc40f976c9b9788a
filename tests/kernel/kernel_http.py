"""Helpers of the real-kernel behaviour suite over HTTP (``test_isolation_http_*``).

The suite drives a real ``twistd -n sandboxd`` with real isolation (``--isolation=auto``: the
cgroup v1 driver on the hybrid hosts, cgroup v2 in the VM of ``tests/vm/run.sh``) as root, over
real HTTP, and looks at the kernel's own view (``/proc``, ``/sys/fs/cgroup``, the files) to judge
what the daemon answers. Every daemon gets a uid block of its own (other suites' daemons run
alongside), and :meth:`KernelDaemon.stop` proves it left nothing behind.
"""

import base64
import hashlib
import http.client
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from attrs import define, field, frozen

from sandboxd.isolation.cgroups.cgroup1 import Cgroup1Driver
from sandboxd.isolation.cgroups.cgroup2 import Cgroup2Driver
from sandboxd.isolation.cgroups.hierarchy import parse_mountinfo, parse_proc_cgroup
from sandboxd.isolation.naming import instance_name
from tests.support.daemon import SHARED_ROOTS, Daemon, start_daemon, stop_daemon
from tests.support.uids import UID_BLOCK, uid_block

IN_VM = os.environ.get("SANDBOXD_VM") == "1"
"""Inside the cgroup v2 VM of ``tests/vm/run.sh`` (software emulation: keep counts small)."""

SLOW = 5.0 if IN_VM else 1.0
"""Factor for the deadlines of things that merely take time (never for a limit's figure)."""

CGROUP_ROOT = Path("/sys/fs/cgroup")


def isolation_problem() -> str | None:
    """Why ``--isolation=auto`` cannot isolate here (``None``: it can), as the daemon decides:
    cgroup v2 where the unified hierarchy delegates ``memory cpu pids`` to us, else cgroup v1.
    """
    if os.geteuid() != 0:
        return "real isolation needs root"
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    why = []
    for driver in (Cgroup2Driver, Cgroup1Driver):
        try:
            found = driver.locate(mounts, own, None, "/x", None, None)  # type: ignore[arg-type]
        except Exception as e:
            why.append(str(e))
            continue
        problem = found.problem() if isinstance(found, Cgroup2Driver) else None
        if problem is None:
            return None
        why.append(problem)
    return "no usable cgroup driver: " + "; ".join(why)


def expected_driver() -> str:
    """The driver ``auto`` must pick: v2 in the VM, v1 on the hybrid hosts."""
    return "cgroup2" if IN_VM else "cgroup1"


# --- the kernel's view ---------------------------------------------------------------------


def proc_uids(pid: int) -> tuple[int, ...] | None:
    """Real, effective, saved and filesystem uid of a live (non-zombie) process, else None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").split()[:1] in (["Z"], ["X"]):
        return None
    return tuple(int(u) for u in fields["Uid"].split())


def alive(pid: int) -> bool:
    return proc_uids(pid) is not None


def host_pid(inner: int, pin: Path) -> int | None:
    """The host's number of the process a sandbox numbers ``inner`` (``$!``, ``os.getpid()``)
    in its PID namespace pinned at ``pin`` (``{root}/.ns/{rid}/pid``); ``inner`` itself where
    the sandbox has no PID namespace (no such pin); ``None`` once that process is gone."""
    try:
        wanted = os.stat(pin)
    except FileNotFoundError:
        return inner
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            held = os.stat(f"/proc/{entry}/ns/pid")
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if (held.st_dev, held.st_ino) != (wanted.st_dev, wanted.st_ino):
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == inner:
                return int(entry)
    return None


def command_pid(pid: int) -> int:
    """The command behind a pid the API reports: with a PID namespace that pid is the relay's
    (outside the namespace) and the command its only child (inside); else ``pid`` itself."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        own = os.stat(f"/proc/{pid}/ns/pid").st_ino
        if len(children) == 1 and os.stat(f"/proc/{children[0]}/ns/pid").st_ino != own:
            return int(children[0])
    except OSError:
        pass
    return pid


def processes_of(uids: Iterable[int]) -> list[int]:
    """Live processes with any of ``uids`` as real, effective, saved or filesystem uid."""
    wanted = set(uids)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ids = proc_uids(int(entry))
            if ids is not None and wanted & set(ids):
                found.append(int(entry))
    return found


def zygotes_of(uid: int) -> list[int]:
    """The live zygotes running as ``uid`` (``sandboxd-zygote``: one per sandbox that runs
    execs, with ``SANDBOXD_SPAWNER=zygote``). Each is one of its sandbox's pids
    (docs/operating.rst, "Zygotes")."""
    found = []
    for pid in processes_of([uid]):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue  # gone meanwhile
        if comm == "sandboxd-zygote":
            found.append(pid)
    return found


def wait_for(predicate: Any, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(step)


def cgroup_dirs_named(*names: str) -> list[str]:
    """Directories with any of ``names`` anywhere under /sys/fs/cgroup (every hierarchy)."""
    wanted = set(names)
    found: list[str] = []
    for top, dirs, _ in os.walk(CGROUP_ROOT):
        found.extend(os.path.join(top, d) for d in dirs if d in wanted)
    return found


def digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_snapshot(top: str | Path) -> dict[str, tuple[int, int, str | None]]:
    """Every entry below ``top`` (links not followed): mode, owner and content digest."""
    snapshot: dict[str, tuple[int, int, str | None]] = {}
    for here, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(here, name)
            st = os.lstat(path)
            content = digest(path) if os.path.isfile(path) and not os.path.islink(path) else None
            snapshot[os.path.relpath(path, top)] = (st.st_mode, st.st_uid, content)
    return snapshot


def scratch_dir(mode: int = 0o755) -> Path:
    """A root-owned directory sandbox uids can reach, on the state roots' filesystem (under
    /tmp/sandboxd-tests, beside the daemons' roots); the caller removes it."""
    SHARED_ROOTS.mkdir(mode=0o711, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="kernel-", dir=SHARED_ROOTS))
    path.chmod(mode)
    return path


# --- HTTP ----------------------------------------------------------------------------------


@frozen
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@frozen
class Result:
    """The last frame of an exec stream."""

    exit: int
    out: bytes
    err: bytes
    oom_killed: bool = False
    """The frame's ``oom_killed`` (absent: ``False``)."""

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace").strip()


class Client:
    """Keep-alive HTTP/1.1 to one daemon, one connection per calling thread.

    A connection idle for :data:`IDLE` seconds is replaced before use: the daemon (Twisted's
    ``HTTPFactory``) closes idle connections after 60 s, and a ``POST`` sent on a connection the
    daemon closed fails without being safe to send again.
    """

    IDLE = 20.0

    def __init__(self, port: int) -> None:
        self.port = port
        self._local = threading.local()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float = 60,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        for attempt in range(2):
            conn = getattr(self._local, "conn", None)
            idle = time.monotonic() - getattr(self._local, "used", 0.0)
            if conn is None or conn.timeout != timeout or idle > self.IDLE:
                if conn is not None:
                    conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
                self._local.conn = conn
            try:
                conn.request(method, path, body=body, headers=dict(headers or {}))
                response = conn.getresponse()
                answer = Answer(response.status, response.read())
                self._local.used = time.monotonic()
                return answer
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # A kept-alive connection the daemon closed between two calls: once more on a
                # fresh one (never for a call that could have reached the daemon twice).
                conn.close()
                self._local.conn = None
                if attempt or method == "POST":
                    raise
        raise AssertionError("unreachable")


RUN_EACH = """\
for script do
  sh -c "$script" >"$TMPDIR/.each-out" 2>"$TMPDIR/.each-err" </dev/null
  code=$?
  out=$(base64 -w0 "$TMPDIR/.each-out") err=$(base64 -w0 "$TMPDIR/.each-err")
  printf '%s,%s,%s\\n' "$code" "$out" "$err"
done
rm -f "$TMPDIR/.each-out" "$TMPDIR/.each-err"
"""


def q(path: str) -> str:
    return urllib.parse.quote(path, safe="")


@define
class KernelDaemon:
    """A real daemon with real isolation, its uid block, and what the tests made with it."""

    daemon: Daemon
    uid_min: int
    uid_max: int
    client: Client
    rids: list[str] = field(factory=list)

    @classmethod
    def start(
        cls,
        tmp_path: Path,
        *args: str,
        uids: int = UID_BLOCK,
        env: Mapping[str, str] | None = None,
        wrapper: tuple[str, ...] = (),
    ) -> "KernelDaemon":
        low, high = uid_block()
        assert 1 <= uids <= UID_BLOCK
        daemon = start_daemon(
            tmp_path,
            "--isolation=auto",
            f"--uid-min={low}",
            f"--uid-max={low + uids - 1}",
            *args,
            env=dict(env or {}),
            wrapper=wrapper,
        )
        kd = cls(daemon, low, high, Client(daemon.port))
        try:
            capabilities = kd.call("GET", "/healthz").json()["capabilities"]
            assert f"isolation.{expected_driver()}" in capabilities, capabilities
        except BaseException:
            stop_daemon(daemon)
            raise
        return kd

    @property
    def root(self) -> Path:
        return self.daemon.root

    def call(self, method: str, path: str, body: Any = None, timeout: float = 60) -> Answer:
        data = None if body is None else json.dumps(body).encode()
        return self.client.request(method, path, data, timeout)

    def healthy(self, timeout: float = 10 * SLOW) -> bool:
        answer = self.call("GET", "/healthz", timeout=timeout)
        return answer.status == 200 and answer.json()["status"] == "ok"

    def create(self, network: str | None = None) -> "Box":
        """A new sandbox (``network``: its mode; ``None``: the daemon's default)."""
        answer = self.call("POST", "/sandboxes", {} if network is None else {"network": network})
        assert answer.status == 200, answer
        rid = str(answer.json()["remote_id"])
        self.rids.append(rid)
        return Box(self, rid)

    @classmethod
    def one_sandbox(cls, tmp_path: Path, *args: str) -> Iterator["Box"]:
        """A daemon started with ``args`` and one sandbox of it, for a module fixture to
        ``yield from``; the daemon is stopped (and proven clean) afterwards."""
        kd = cls.start(tmp_path, *args)
        try:
            yield kd.create()
        finally:
            kd.stop()

    def stop(self) -> None:
        """SIGTERM (drain), then prove nothing is left: no process of the uid block, no
        cgroup of this daemon (its instance directory nor any sandbox's), no state root."""
        instance = instance_name(str(self.root))
        stop_daemon(self.daemon)
        # twistd re-raises the SIGTERM it stopped on: -15 is a clean stop.
        returncode = self.daemon.process.returncode
        assert returncode in (0, -signal.SIGTERM), (returncode, self.daemon.log.read_text())
        uids = range(self.uid_min, self.uid_max + 1)
        assert wait_for(lambda: not processes_of(uids), 10 * SLOW), processes_of(uids)
        assert cgroup_dirs_named(instance, *self.rids) == []
        assert not self.root.exists()


@define
class Box:
    """One sandbox of a :class:`KernelDaemon`."""

    kd: KernelDaemon
    rid: str

    @property
    def directory(self) -> Path:
        return self.kd.root / self.rid

    @property
    def workspace(self) -> Path:
        return self.directory / "workspace"

    def url(self, what: str, **params: str) -> str:
        query = "&".join(f"{k}={q(v)}" for k, v in params.items())
        return f"/sandboxes/{self.rid}/{what}" + (f"?{query}" if query else "")

    def exec(
        self,
        cmd: list[str],
        timeout: float = 60,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        body: dict[str, Any] = {"cmd": cmd, "timeout": timeout}
        if env is not None:
            body["env"] = dict(env)
        answer = self.kd.call("POST", self.url("exec"), body, timeout=timeout + 30)
        assert answer.status == 200, answer
        final = json.loads(answer.body.splitlines()[-1])
        assert "exit" in final, final
        return Result(
            int(final["exit"]),
            base64.b64decode(final["out"]),
            base64.b64decode(final["err"]),
            final.get("oom_killed", False),
        )

    def run(self, script: str, timeout: float = 60) -> Result:
        """``sh -c script`` in the sandbox."""
        return self.exec(["sh", "-c", script], timeout=timeout)

    def run_each(self, scripts: list[str], timeout: float = 120) -> list[Result]:
        """``sh -c script`` for each script, one after the other, in one exec (round trips
        are what costs most in the VM); each one's own exit code and output."""
        answer = self.exec(["sh", "-c", RUN_EACH, "sh", *scripts], timeout=timeout)
        assert answer.exit == 0, answer
        results = []
        for line in answer.out.decode().splitlines():
            code, out, err = line.split(",")
            results.append(Result(int(code), base64.b64decode(out), base64.b64decode(err)))
        assert len(results) == len(scripts), answer
        return results

    def ok(self, script: str, timeout: float = 60) -> str:
        """``sh -c script``, which must succeed; its stdout."""
        result = self.run(script, timeout)
        assert result.exit == 0, result
        return result.text

    def uid(self) -> int:
        return int(self.ok("id -u"))

    def download(self, path: str) -> Answer:
        return self.kd.call("GET", self.url("file", path=path))

    def upload(self, path: str, data: bytes) -> Answer:
        return self.kd.client.request("PUT", self.url("file", path=path), data)

    def delete(self, path: str) -> Answer:
        return self.kd.call("DELETE", self.url("file", path=path))

    def rmdir(self, path: str) -> Answer:
        return self.kd.call("DELETE", self.url("dir", path=path))

    def mkdir(self, path: str) -> Answer:
        return self.kd.call("POST", self.url("mkdir"), {"path": path})

    def rename(self, src: str, dst: str) -> Answer:
        return self.kd.call("POST", self.url("rename"), {"src": src, "dst": dst})

    def exists(self, path: str) -> Answer:
        return self.kd.call("GET", self.url("exists", path=path))

    def size(self, path: str) -> Answer:
        return self.kd.call("GET", self.url("size", path=path))

    def walk(self, root: str = "/") -> Answer:
        return self.kd.call("GET", self.url("walk", root=root))

    def ready(self) -> bool:
        answer = self.kd.call("GET", self.url("ready"))
        assert answer.status == 200, answer
        return bool(answer.json()["ready"])

    def stats(self) -> dict[str, int]:
        answer = self.kd.call("GET", self.url("stats"))
        assert answer.status == 200, answer
        return dict(answer.json())

    def kill(self) -> Answer:
        return self.kd.call("DELETE", f"/sandboxes/{self.rid}")


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
