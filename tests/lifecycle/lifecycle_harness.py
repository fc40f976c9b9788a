"""An in-process daemon for the lifecycle state machine, driven synchronously.

The daemon is built by the composition root (``build_isolation``, then
:func:`sandboxd.assemble.in_process`) with the real backend: real directories, real thread pools
for file work (the kernel variant's pool threads switch fsuid/fsgid for real), real processes
for exec, and for the kernel variant real uids and cgroups. HTTP goes through ``StubTreq``
(in memory); the manager's time comes from a ``Clock`` that moves only when a rule moves it.

Rules are synchronous: the machine runs in a greenlet beside the reactor (:func:`synchronously`),
and :func:`spin` waits for a Deferred by flushing the in-memory connections and letting the real
reactor turn, so thread-pool results, ``FileSender`` and process output all arrive; a hang guard
turns a stuck call into a failure.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import greenlet
import treq
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from twisted.web.iweb import UNKNOWN_LENGTH

from sandboxd.assemble import in_process
from sandboxd.config import Config
from sandboxd.core.layout import Layout
from sandboxd.core.manager import SandboxManager
from sandboxd.http.api import SandboxAPI
from sandboxd.isolation.base import Isolation
from sandboxd.isolation.select import Host, build_isolation

T = TypeVar("T")

POLL = 0.0005
"""Seconds the real reactor runs between two looks at a pending call."""

HANG_GUARD = 30.0
"""Real seconds after which a call that has not answered fails the test (never a timing)."""

BASE = "http://sandboxd.test"


def real_reactor() -> Any:
    from twisted.internet import reactor

    return reactor


class Driver(greenlet.greenlet):
    """A greenlet running synchronous test code; :func:`pause` lets the reactor turn."""


def synchronously(f: Callable[[], T]) -> Deferred[T]:
    """Run ``f()`` (synchronous code that may :func:`spin`) beside the running reactor.

    Call from code the reactor runs (a pytest-twisted test); the Deferred fires with the
    result of ``f`` once it returns. ``f`` runs in a :class:`Driver` greenlet whose parent is the
    reactor's: each :func:`pause` switches back to the reactor and is resumed by a timed call.
    """
    done: Deferred[T] = Deferred()

    def body() -> None:
        outcome: Any
        try:
            outcome = f()
        except BaseException:
            outcome = Failure()
        # Fire from the reactor's greenlet once this one has ended, never from inside it.
        fire = done.errback if isinstance(outcome, Failure) else done.callback
        real_reactor().callLater(0, fire, outcome)

    Driver(body).switch()
    return done


def pause(seconds: float = POLL) -> None:
    """Let the real reactor run for about ``seconds`` (only inside :func:`synchronously`)."""
    me = greenlet.getcurrent()
    if not isinstance(me, Driver):
        raise AssertionError("waiting for the reactor outside synchronously()")
    real_reactor().callLater(seconds, me.switch)
    me.parent.switch()


def spin(d: Deferred[T], stub: StubTreq | None = None, limit: float = HANG_GUARD) -> T:
    """The result of ``d`` (raising its failure), pumping ``stub`` and the real reactor."""
    box: list[Any] = []
    d.addBoth(box.append)
    spin_until(lambda: bool(box), stub, limit)
    result = box[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result


def spin_until(
    predicate: Callable[[], bool], stub: StubTreq | None = None, limit: float = HANG_GUARD
) -> None:
    """Pump ``stub`` and let the reactor turn until ``predicate()`` holds (hang-guarded)."""
    deadline = time.monotonic() + limit
    while True:
        if stub is not None:
            stub.flush()
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing happened within {limit} s (hang guard)")
        pause()


@attrs.define
class Reply:
    """One complete HTTP answer."""

    status: int
    headers: Mapping[bytes, list[bytes]]
    body: bytes
    length: int | None

    def json(self) -> Any:
        assert self.headers.get(b"content-type") == [b"application/json"], self
        return json.loads(self.body)

    def error(self) -> tuple[int, str]:
        body = self.json()
        assert set(body) == {"error", "detail"}, body
        return self.status, str(body["error"])


class ExecCall:
    """An exec request in flight; its NDJSON body is collected as it arrives."""

    def __init__(self, d: Deferred[Any]) -> None:
        self.raw = bytearray()
        self.status: int | None = None
        self.content_type: list[bytes] | None = None
        self.done = False
        self.failure: Failure | None = None
        d.addCallback(self._response).addErrback(self._failed)

    def _response(self, response: Any) -> None:
        self.status = response.code
        self.content_type = response.headers.getRawHeaders(b"content-type")
        treq.collect(response, self.raw.extend).addCallbacks(self._ended, self._failed)

    def _ended(self, _: object) -> None:
        self.done = True

    def _failed(self, failure: Failure) -> None:
        self.failure = failure
        self.done = True

    def frames(self) -> list[dict[str, Any]]:
        lines = bytes(self.raw).split(b"\n")
        assert lines[-1] == b"", f"stream ends mid-line: {bytes(self.raw)[-200:]!r}"
        return [json.loads(line) for line in lines[:-1]]

    def result(self) -> tuple[int, bytes, bytes]:
        """``(exit, out, err)`` of a stream that ended with an exit frame."""
        assert self.failure is None, self.failure
        assert self.status == 200, (self.status, bytes(self.raw))
        assert self.content_type == [b"application/x-ndjson"]
        frames = self.frames()
        last = frames[-1]
        assert "exit" in last, last
        live = b"".join(base64.b64decode(f["o"]) for f in frames[:-1])
        out, err = base64.b64decode(last["out"]), base64.b64decode(last["err"])
        assert sorted(live) == sorted(out + err), "live chunks and final buffers disagree"
        return int(last["exit"]), out, err


@attrs.define
class InProcessDaemon:
    """The daemon's parts, wired by the composition root, and a synchronous client."""

    config: Config
    clock: Clock
    isolation: Isolation
    manager: SandboxManager
    api: SandboxAPI
    stub: StubTreq
    pools: list[ThreadPool]
    scratch: str
    """The temporary directory holding ``config.root`` (removed by :meth:`close`)."""

    @property
    def layout(self) -> Layout:
        return self.manager.layout

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        data: bytes | None = None,
    ) -> Reply:
        kwargs: dict[str, Any] = {}
        if params is not None:
            kwargs["params"] = dict(params)
        if body is not None:
            kwargs["data"] = json.dumps(body).encode()
        if data is not None:
            kwargs["data"] = data
        response = spin(self.stub.request(method, BASE + path, **kwargs), self.stub)
        content = spin(treq.content(response), self.stub)
        headers = {k.lower(): v for k, v in response.headers.getAllRawHeaders()}
        length = None if response.length is UNKNOWN_LENGTH else response.length
        return Reply(response.code, headers, content, length)

    def start_exec(self, rid: str, body: Mapping[str, Any]) -> ExecCall:
        d = self.stub.request(
            "POST", f"{BASE}/sandboxes/{rid}/exec", data=json.dumps(body).encode()
        )
        return ExecCall(d)

    def finish(self, call: ExecCall) -> ExecCall:
        spin_until(lambda: call.done, self.stub)
        return call

    def exec(self, rid: str, body: Mapping[str, Any]) -> ExecCall:
        return self.finish(self.start_exec(rid, body))

    def close(self) -> None:
        """Stop the pools, close the manager's descriptor, remove cgroup instances and files.

        Whatever a failed example left alive is killed first (best effort): a failing test
        must not leave processes or cgroups on the host.
        """
        for rid in list(self.manager.sandboxes):
            with contextlib.suppress(Exception):
                spin(Deferred.fromCoroutine(self.manager.kill(rid)), self.stub, limit=10)
        cgroups = self.isolation.cgroups
        for rid in cgroups.leftovers():
            with contextlib.suppress(Exception):
                spin(cgroups.kill(rid), self.stub, limit=10)
                cgroups.remove(rid)
        for pool in self.pools:
            pool.stop()
        if self.manager._devnull >= 0:
            os.close(self.manager._devnull)
            self.manager._devnull = -1
        remove_instance = getattr(self.isolation.cgroups, "remove_instance", None)
        if remove_instance is not None:
            remove_instance()
        self.isolation.namespaces.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def scratch_root() -> str:
    """A fresh directory that sandbox uids can pass through (0711, like the daemon's root)."""
    scratch = tempfile.mkdtemp(prefix="sandboxd-lifecycle-", dir="/tmp")
    os.chmod(scratch, 0o711)
    return scratch


def build_daemon(settings: Mapping[str, str], host: Host | None = None) -> InProcessDaemon:
    """Build and start an in-process daemon; ``settings`` are ``twistd sandboxd`` options."""
    scratch = scratch_root()
    # drain-idle 0s: the manager's clock is a Clock nobody advances, so a drain may not wait
    # for a grace; it takes each sandbox as soon as nothing runs in it.
    options = {
        "root": os.path.join(scratch, "root"),
        "drain-idle": "0s",
        "pod-url": "http://sandboxd.test",
        **settings,
    }
    config = Config.load({}, options)
    reactor = real_reactor()
    clock = Clock()
    file_pool = ThreadPool(minthreads=1, maxthreads=4, name="lifecycle-files")
    admin_pool = ThreadPool(minthreads=0, maxthreads=2, name="lifecycle-admin")
    try:
        if host is None:
            isolation = build_isolation(config, reactor, file_pool)
        else:
            isolation = build_isolation(config, reactor, file_pool, host)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    served = in_process(config, reactor, clock, isolation, admin_pool, token=None)
    manager, api = served.manager, served.api
    file_pool.start()
    admin_pool.start()
    stub = StubTreq(api.app.resource())
    daemon = InProcessDaemon(
        config, clock, isolation, manager, api, stub, [file_pool, admin_pool], scratch
    )
    try:
        spin(manager.start(), stub)
    except BaseException:
        daemon.close()
        raise
    return daemon


# What the kernel holds, read from /proc (for leak checks)


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def processes_by_uid(low: int, high: int) -> dict[int, list[int]]:
    """``{uid: pids}`` of live processes whose real, effective, saved or fs uid is in the range.

    Zombies do not count: they are dead, and reaping them is their parent's business (an
    orphan's is init's, which may take its time).
    """
    found: dict[int, list[int]] = {}
    for pid in _pids():
        try:
            status = _status(pid)
        except OSError:
            continue
        if status.get("State", "").startswith(("Z", "X")):
            continue
        uids = status.get("Uid", "").split()
        for uid in {int(u) for u in uids}:
            if low <= uid <= high:
                found.setdefault(uid, []).append(pid)
    return found


def processes_with_uids(low: int, high: int) -> list[int]:
    """Pids of processes with any uid in ``[low, high]``."""
    return sorted({pid for pids in processes_by_uid(low, high).values() for pid in pids})


def is_zygote(pid: int) -> bool:
    """``pid`` is a sandbox's zygote (``sandboxd-zygote``: with ``SANDBOXD_SPAWNER=zygote``, one
    per sandbox that ran a command, until it is retired or its sandbox killed)."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip() == b"sandboxd-zygote"
    except OSError:
        return False  # gone


def describe(pids: list[int]) -> list[str]:
    """``pid state ppid cmdline`` of each process (for failure messages)."""
    lines = []
    for pid in pids:
        try:
            status = _status(pid)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            lines.append(f"{pid} gone")
            continue
        lines.append(f"{pid} {status.get('State')} ppid={status.get('PPid')} {cmdline}")
    return lines


def processes_under(directory: str) -> list[int]:
    """Pids whose working directory is ``directory`` or below it."""
    prefix = os.path.realpath(directory).rstrip("/") + "/"
    found = []
    for pid in _pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if (cwd.rstrip("/") + "/").startswith(prefix):
            found.append(pid)
    return found
