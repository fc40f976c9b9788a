"""The lifecycle state machine: random sequences of calls against a model (issue 7).

Each rule makes one call through the HTTP API of an in-process daemon with the real backend
and checks the answer against :mod:`lifecycle_model`; the invariants, run after every step,
compare the whole daemon with the model: the walk of every workspace (and the tree on disk),
the ready marks, the live listing, the uid pool (free + used = total), and 404
``SandboxNotFound`` for every killed handle. Teardown kills what is left through the API and
proves nothing leaked: no process, cgroup, directory or uid.
"""

from __future__ import annotations

import base64
import os
import random
import stat
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from sandboxd.isolation.base import Identity
from sandboxd.isolation.naming import is_rid
from tests.lifecycle.lifecycle_harness import (
    BASE,
    ExecCall,
    InProcessDaemon,
    describe,
    is_zygote,
    processes_by_uid,
    processes_under,
    processes_with_uids,
    spin,
    spin_until,
)
from tests.lifecycle.lifecycle_model import BAD, Parts, SandboxModel, render

NAMES = ("a", "b", "c")
SIGKILL_EXIT = 137
MEDIUM_SIZES = (100_001, 262_144)
"""Over twisted.web's 100 000-byte in-memory limit: the body arrives through a temporary file."""

parts_st = st.lists(st.sampled_from(NAMES), max_size=3).map(tuple)
nonroot_st = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple)


def _spell(parts: Parts, style: int) -> str:
    """The same path written the ways a client may write it (all mean ``parts``)."""
    if style == 0:
        return "/".join(parts)
    if style == 1:
        return render(parts)
    if style == 2:
        return "./" + "//".join(parts) + ("/" if parts else "")
    return "/".join(("x", "..", *parts))


def _blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


data_st = st.one_of(
    st.binary(max_size=64),
    st.builds(_blob, st.integers(0, 2**16), st.sampled_from(MEDIUM_SIZES)),
)
style_st = st.integers(0, 3)
text_st = st.text(alphabet="xyz", max_size=8)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class LifecycleMachine(RuleBasedStateMachine):
    """Create, use and kill sandboxes at random; the daemon must match the model throughout.

    ``make_daemon`` builds the variant (``none`` or a cgroup driver); ``kernel`` says whether
    the variant isolates for real (uids, cgroups), which enables the checks that need it.
    """

    sandboxes = Bundle("sandboxes")
    make_daemon: Callable[[], InProcessDaemon]
    kernel: bool = False
    tally: dict[str, int] = {}
    """Calls made, by rule name, over every example of the run (a figure for the report)."""

    def __init__(self) -> None:
        super().__init__()
        self.daemon = type(self).make_daemon()
        self.count("examples")
        self.live: dict[str, SandboxModel] = {}
        self.killed: list[str] = []
        self.drained = False

    # Helpers

    def count(self, name: str) -> None:
        self.tally[name] = self.tally.get(name, 0) + 1

    @property
    def total(self) -> int:
        return int(self.daemon.isolation.uids.total)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.daemon.request(method, path, **kwargs)

    def gone(self, reply: Any) -> None:
        assert reply.error() == (404, "SandboxNotFound"), reply

    def answered(self, reply: Any, expected: tuple[int, str | None]) -> None:
        status, error = expected
        if error is None:
            assert reply.status == status, (reply, expected)
        else:
            assert reply.error() == expected, reply

    def file_call(
        self, method: str, rid: str, route: str, model_op: Callable[[SandboxModel], Any], **kw: Any
    ) -> Any:
        """One file call: ``404 SandboxNotFound`` for a dead handle, else the model's answer."""
        reply = self.call(method, f"/sandboxes/{rid}/{route}", **kw)
        sandbox = self.live.get(rid)
        if sandbox is None:
            self.gone(reply)
            return None
        expected = model_op(sandbox)
        self.answered(reply, expected)
        return reply

    # Lifecycle

    @rule(target=sandboxes, greeting=st.sampled_from(["", "hello", "x y"]))
    def create(self, greeting: str) -> Any:
        self.count("create")
        env = {"GREETING": greeting} if greeting else {}
        reply = self.call("POST", "/sandboxes", body={"env": env} if env else {})
        if self.drained:
            assert reply.error() == (503, "Draining"), reply
            return multiple()
        if len(self.live) >= self.total:
            assert reply.error() == (503, "NoCapacity"), reply
            return multiple()
        assert reply.status == 200, reply
        body = reply.json()
        rid = body["remote_id"]
        assert body["pod_url"] == "http://sandboxd.test"
        assert rid not in self.live and rid not in self.killed
        self.live[rid] = SandboxModel(env=env)
        return rid

    @rule(rid=sandboxes)
    def kill(self, rid: str) -> None:
        self.count("kill")
        reply = self.call("DELETE", f"/sandboxes/{rid}")
        if rid not in self.live:
            self.gone(reply)
            return
        assert (reply.status, reply.body) == (204, b""), reply
        self.forget(rid)
        self.check_processes()

    def forget(self, rid: str) -> None:
        """The sandbox is killed: its handle answers 404 and writes through it go nowhere."""
        del self.live[rid]
        self.killed.append(rid)
        self.gone(self.call("PUT", f"/sandboxes/{rid}/file", params={"path": "f"}, data=b"x"))
        self.gone(self.call("POST", f"/sandboxes/{rid}/mkdir", body={"path": "d"}))
        assert not os.path.exists(self.daemon.layout.directory(rid)), rid

    @rule(rid=sandboxes)
    def kill_during_exec(self, rid: str) -> None:
        """Kill a sandbox while a command runs in it: the stream ends with ``137``."""
        self.count("kill_during_exec")
        if rid not in self.live:
            self.gone(self.call("DELETE", f"/sandboxes/{rid}"))
            return
        manager = self.daemon.manager
        running = self.daemon.start_exec(rid, {"cmd": ["sleep", "60"]})
        runs = manager.sandboxes[rid].running
        # started: its pid known (a spawn server's or zygote's child has it at the answer)
        spin_until(
            lambda: bool(runs) and all(run.pid is not None for run in runs), self.daemon.stub
        )
        assert len(runs) == 1
        reply = self.call("DELETE", f"/sandboxes/{rid}")
        assert reply.status == 204, reply
        code, _, _ = self.daemon.finish(running).result()
        assert code == SIGKILL_EXIT
        self.forget(rid)
        self.check_processes()

    @precondition(lambda self: not self.drained and len(self.live) >= 2)
    @rule()
    def drain(self) -> None:
        """``POST /drain``, then the drain the daemon's service runs: every sandbox goes, new
        ones are refused, ``/readyz`` says 503 (a final state for this daemon)."""
        self.count("drain")
        reply = self.call("POST", "/drain")
        assert (reply.status, reply.body) == (204, b""), reply
        spin(self.daemon.manager.drain(), self.daemon.stub)
        self.drained = True
        for rid in sorted(self.live):
            self.forget(rid)
        self.check_processes()
        reply = self.call("GET", "/readyz")
        assert (reply.status, reply.json()["ready"]) == (503, False), reply
        assert self.call("GET", "/healthz").json()["status"] == "draining"

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def idle_reaper(self, data: st.DataObject) -> None:
        """Half the TTL passes, some sandboxes are used, half again: the others are reaped."""
        self.count("idle_reaper")
        # In the order of creation, not of the ids: ids are random, so a sorted list would let
        # the same draws keep other sandboxes in another run, and Hypothesis replays prefixes.
        keep = data.draw(st.sets(st.sampled_from(list(self.live))))
        half = self.daemon.config.idle_ttl / 2
        self.daemon.clock.advance(half)
        for rid in sorted(keep):
            assert self.call("GET", f"/sandboxes/{rid}/ready").status == 200
        self.daemon.clock.advance(half)
        spin(self.daemon.manager.reap_idle(), self.daemon.stub)
        for rid in sorted(set(self.live) - keep):
            self.forget(rid)
        self.check_processes()

    # Files

    @rule(rid=sandboxes, parts=parts_st, style=style_st, data=data_st)
    def upload(self, rid: str, parts: Parts, style: int, data: bytes) -> None:
        self.count("upload")
        path = _spell(parts, style)
        reply = self.file_call(
            "PUT",
            rid,
            "file",
            lambda s: s.workspace.upload(parts, data),
            params={"path": path},
            data=data,
        )
        if reply is not None and reply.status == 204:
            self.live[rid].rewritten.add(render(parts))

    @rule(rid=sandboxes, parts=parts_st, style=style_st)
    def download(self, rid: str, parts: Parts, style: int) -> None:
        self.count("download")
        params = {"path": _spell(parts, style)}
        reply = self.call("GET", f"/sandboxes/{rid}/file", params=params)
        sandbox = self.live.get(rid)
        if sandbox is None:
            self.gone(reply)
            return
        expected, content = sandbox.workspace.download(parts)
        if content is None:
            self.answered(reply, expected)
            return
        assert reply.status == 200, reply
        assert reply.headers.get(b"content-type") == [b"application/octet-stream"]
        assert reply.length == len(content)
        assert reply.body == content

    @rule(rid=sandboxes, parts=parts_st, style=style_st)
    def delete(self, rid: str, parts: Parts, style: int) -> None:
        self.count("delete")
        self.file_call(
            "DELETE",
            rid,
            "file",
            lambda s: s.workspace.delete(parts),
            params={"path": _spell(parts, style)},
        )

    @rule(rid=sandboxes, parts=parts_st, style=style_st)
    def mkdir(self, rid: str, parts: Parts, style: int) -> None:
        self.count("mkdir")
        self.file_call(
            "POST",
            rid,
            "mkdir",
            lambda s: s.workspace.mkdir(parts),
            body={"path": _spell(parts, style)},
        )

    @rule(rid=sandboxes, parts=parts_st, style=style_st)
    def rmdir(self, rid: str, parts: Parts, style: int) -> None:
        self.count("rmdir")
        self.file_call(
            "DELETE",
            rid,
            "dir",
            lambda s: s.workspace.rmdir(parts),
            params={"path": _spell(parts, style)},
        )

    @rule(rid=sandboxes, source=parts_st, dest=parts_st, style=style_st)
    def rename(self, rid: str, source: Parts, dest: Parts, style: int) -> None:
        self.count("rename")
        self.file_call(
            "POST",
            rid,
            "rename",
            lambda s: s.workspace.rename(source, dest),
            body={"src": _spell(source, style), "dst": _spell(dest, 3 - style)},
        )

    @rule(rid=sandboxes, parts=parts_st, method=st.sampled_from(["GET", "PUT", "DELETE"]))
    def escape(self, rid: str, parts: Parts, method: str) -> None:
        """A path climbing out of the workspace is refused before anything is touched."""
        self.count("escape")
        path = "/".join(("..", *parts))
        data = b"x" if method == "PUT" else None
        self.file_call(
            "GET" if method == "GET" else method,
            rid,
            "file",
            lambda s: BAD,
            params={"path": path},
            data=data,
        )

    @rule(rid=sandboxes, parts=parts_st, style=style_st)
    def exists(self, rid: str, parts: Parts, style: int) -> None:
        self.count("exists")
        params = {"path": _spell(parts, style)}
        reply = self.file_call("GET", rid, "exists", lambda s: (200, None), params=params)
        if reply is not None:
            assert reply.json() == {"exists": self.live[rid].workspace.exists(parts)}

    @rule(rid=sandboxes, parts=parts_st, style=style_st)
    def size(self, rid: str, parts: Parts, style: int) -> None:
        self.count("size")
        params = {"path": _spell(parts, style)}
        reply = self.file_call("GET", rid, "size", lambda s: (200, None), params=params)
        if reply is not None:
            assert reply.json() == {"size": self.live[rid].workspace.size(parts)}

    @rule(rid=sandboxes, parts=parts_st, style=style_st)
    def walk_under(self, rid: str, parts: Parts, style: int) -> None:
        self.count("walk")
        params = {"root": _spell(parts, style)}
        reply = self.file_call("GET", rid, "walk", lambda s: (200, None), params=params)
        if reply is not None:
            entries = reply.json()["entries"]
            got = {e["path"]: e["size"] for e in entries}
            assert len(got) == len(entries), "a path listed twice"
            assert got == self.live[rid].workspace.walk(parts)

    @rule(rid=sandboxes)
    def disk_usage(self, rid: str) -> None:
        self.count("disk_usage")
        reply = self.file_call("GET", rid, "disk-usage", lambda s: (200, None))
        if reply is not None:
            files = self.live[rid].workspace.files()
            assert reply.json() == {"bytes": sum(len(v) for v in files.values())}

    @rule(rid=sandboxes)
    def stats(self, rid: str) -> None:
        """Operators' view of the cgroup: numbers, and a live process counted where one is."""
        self.count("stats")
        reply = self.file_call("GET", rid, "stats", lambda s: (200, None))
        if reply is None:
            return
        stats = reply.json()
        keys = {"memory_bytes", "memory_peak_bytes", "cpu_usec", "pids", "oom_kills"}
        disk = {"disk_bytes", "disk_limit_bytes", "files", "files_limit"}
        assert set(stats) == keys | disk | {"cpus"}
        assert all(type(stats[k]) is int and stats[k] >= 0 for k in keys)
        assert all(stats[k] is None for k in disk)  # no disk limits configured here
        assert stats["oom_kills"] == 0
        cpus = stats["cpus"]  # the CPUs it is placed on, with real cgroups that place it
        if self.kernel and cpus is not None:
            assert cpus and all(type(c) is int and c >= 0 for c in cpus), cpus
        else:
            assert cpus is None, cpus
        if self.kernel and self.live[rid].background:
            assert stats["pids"] >= 1, stats

    # Ready marker

    @rule(rid=sandboxes)
    def mark_ready(self, rid: str) -> None:
        self.count("mark_ready")
        reply = self.file_call("POST", rid, "mark-ready", lambda s: (204, None))
        if reply is not None:
            self.live[rid].ready = True

    @rule(rid=sandboxes)
    def ready(self, rid: str) -> None:
        self.count("ready")
        reply = self.file_call("GET", rid, "ready", lambda s: (200, None))
        if reply is not None:
            assert reply.json() == {"ready": self.live[rid].ready}

    # Commands

    def run(self, rid: str, body: dict[str, Any]) -> tuple[int, bytes, bytes] | None:
        """Exec ``body`` to its end: ``(exit, out, err)``, or None for a dead handle (404)."""
        call = self.daemon.exec(rid, body)
        if rid not in self.live:
            assert call.status == 404, (call.status, bytes(call.raw))
            assert b'"SandboxNotFound"' in call.raw
            return None
        return call.result()

    @rule(rid=sandboxes, parts=parts_st)
    def exec_cat(self, rid: str, parts: Parts) -> None:
        self.count("exec")
        result = self.run(rid, {"cmd": ["cat", "--", "/".join(parts) or "."]})
        if result is None:
            return
        code, out, _ = result
        workspace = self.live[rid].workspace
        if workspace.kind(parts) == "file":
            assert (code, out) == (0, workspace.entries[parts])
        else:
            assert code == 1 and out == b""

    @rule(rid=sandboxes, parts=nonroot_st, text=text_st)
    def exec_write(self, rid: str, parts: Parts, text: str) -> None:
        """A command writes a file: the API sees it (walk, size, download)."""
        self.count("exec")
        script = 'printf %s "$1" > "$2"'
        result = self.run(rid, {"cmd": ["sh", "-c", script, "sh", text, "/".join(parts)]})
        if result is None:
            return
        code, _, _ = result
        written = self.live[rid].workspace.shell_write(parts, text.encode())
        assert (code == 0) == written, (code, parts)

    @rule(rid=sandboxes, code=st.integers(0, 255), data=st.binary(max_size=32))
    def exec_exit_and_stdin(self, rid: str, code: int, data: bytes) -> None:
        self.count("exec")
        body = {"cmd": ["sh", "-c", 'cat; exit "$1"', "sh", str(code)], "stdin": b64(data)}
        result = self.run(rid, body)
        if result is not None:
            assert result[:2] == (code, data)

    @rule(rid=sandboxes)
    def exec_env_and_missing(self, rid: str) -> None:
        """Create-time env reaches commands, exec env overrides it; a missing command is 127."""
        self.count("exec")
        cmd = ["sh", "-c", 'printf %s "$GREETING"']
        result = self.run(rid, {"cmd": cmd})
        if result is None:
            return
        assert result[:2] == (0, self.live[rid].env.get("GREETING", "").encode())
        result = self.run(rid, {"cmd": cmd, "env": {"GREETING": "over"}})
        assert result is not None and result[:2] == (0, b"over")
        result = self.run(rid, {"cmd": ["no-such-command-sandboxd"]})
        assert result is not None and result[0] == 127

    @precondition(lambda self: self.kernel)
    @rule(rid=sandboxes)
    def exec_identity(self, rid: str) -> None:
        """Commands run as the sandbox's own uid/gid, inside its own cgroup."""
        self.count("exec")
        result = self.run(rid, {"cmd": ["sh", "-c", "id -u; id -g; id -G; cat /proc/self/cgroup"]})
        if result is None:
            return
        code, out, err = result
        assert code == 0, err
        identity = self.daemon.manager.sandboxes[rid].identity
        lines = out.decode().splitlines()
        assert lines[:3] == [str(identity.uid), str(identity.gid), str(identity.gid)]
        cgroups = dict(line.split(":", 2)[1:] for line in lines[3:])
        for controller in ("memory", "pids"):
            assert cgroups[controller].endswith("/" + rid), cgroups

    @precondition(lambda self: self.kernel)
    @rule(rid=sandboxes)
    def exec_leaves_background(self, rid: str) -> None:
        """A command leaves a detached process (own session): kill must still stop it."""
        self.count("exec")
        script = "setsid sleep 300 </dev/null >/dev/null 2>&1 &"
        result = self.run(rid, {"cmd": ["sh", "-c", script]})
        if result is not None:
            assert result[0] == 0
            self.live[rid].background = True
            self.check_processes()

    # Invariants

    @invariant()
    def listing_and_pool_match(self) -> None:
        listed = self.call("GET", "/sandboxes").json()["sandboxes"]
        assert {s["remote_id"]: s["ready"] for s in listed} == {
            rid: s.ready for rid, s in self.live.items()
        }
        manager = self.daemon.manager
        assert set(manager.sandboxes) == set(self.live)
        uids = self.daemon.isolation.uids
        assert uids.free + len(self.live) == uids.total, (uids.free, len(self.live))
        if self.kernel:
            identities = [s.identity for s in manager.sandboxes.values()]
            assert len(set(identities)) == len(identities), "an identity handed out twice"
            low, high = self.daemon.config.uid_min, self.daemon.config.uid_max
            assert all(low <= i.uid <= high and i.gid == i.uid for i in identities)

    @invariant()
    def workspaces_match(self) -> None:
        for rid, sandbox in self.live.items():
            reply = self.call("GET", f"/sandboxes/{rid}/walk")
            entries = reply.json()["entries"]
            expected = {render(p): len(v) for p, v in sandbox.workspace.files().items()}
            assert {e["path"]: e["size"] for e in entries} == expected
            versions = {e["path"]: e["version"] for e in entries}
            for path in sandbox.rewritten:
                if path in sandbox.versions and path in versions:
                    assert versions[path] != sandbox.versions[path], f"{path}: same version"
            sandbox.versions, sandbox.rewritten = versions, set()
            self.check_disk(rid, sandbox)

    def check_disk(self, rid: str, sandbox: SandboxModel) -> None:
        """The tree on disk is the model's: no temporary upload left, every byte right."""
        layout = self.daemon.layout
        top = layout.workspace(rid)
        identity = self.daemon.manager.sandboxes[rid].identity
        found: dict[Parts, bytes | None] = {}
        for path, dirs, files in os.walk(top):
            rel = tuple(os.path.relpath(path, top).split(os.sep)) if path != top else ()
            for name in dirs:
                found[(*rel, name)] = None
                self.check_owner(os.path.join(path, name), identity)
            for name in files:
                with open(os.path.join(path, name), "rb") as f:
                    found[(*rel, name)] = f.read()
                self.check_owner(os.path.join(path, name), identity)
        assert found == sandbox.workspace.entries
        assert os.path.isfile(layout.ready_marker(rid)) == sandbox.ready

    def check_owner(self, path: str, identity: Identity) -> None:
        if self.kernel:
            st_ = os.lstat(path)
            assert (st_.st_uid, st_.st_gid) == (identity.uid, identity.gid), path
            assert not st_.st_mode & (stat.S_ISUID | stat.S_ISGID)

    @invariant()
    def killed_handles_are_gone(self) -> None:
        for rid in self.killed[-2:]:
            self.gone(self.call("GET", f"/sandboxes/{rid}/ready"))
            assert not os.path.exists(self.daemon.layout.directory(rid)), rid
            assert rid not in self.daemon.isolation.cgroups.leftovers()

    # Background processes (docs/extensions.rst, "Background processes")

    def follow(self, rid: str, process_id: str) -> ExecCall:
        """A following read of a process's output, in flight."""
        url = f"{BASE}/sandboxes/{rid}/processes/{process_id}/output?follow=true"
        return ExecCall(self.daemon.stub.request("GET", url))  # type: ignore[attr-defined]

    def start_process(self, rid: str, cmd: list[str]) -> str | None:
        reply = self.call("POST", f"/sandboxes/{rid}/processes", body={"cmd": cmd})
        if rid not in self.live:
            self.gone(reply)
            return None
        assert reply.status == 200, reply
        process_id = str(reply.json()["id"])
        listed = self.call("GET", f"/sandboxes/{rid}/processes").json()["processes"]
        assert process_id in [p["id"] for p in listed]
        return process_id

    @rule(rid=sandboxes, text=text_st, code=st.integers(0, 3))
    def process_start_and_read(self, rid: str, text: str, code: int) -> None:
        """A background command's output read from 0 to its exit, then again from an
        offset without following."""
        self.count("process_start_and_read")
        process_id = self.start_process(rid, ["sh", "-c", f"printf %s '{text}'; exit {code}"])
        if process_id is None:
            return
        frames = self.daemon.finish(self.follow(rid, process_id)).frames()
        assert frames[-1] == {"exit": code}, frames
        assert b"".join(base64.b64decode(f["o"]) for f in frames if "o" in f) == text.encode()
        reply = self.call(
            "GET",
            f"/sandboxes/{rid}/processes/{process_id}/output",
            params={"offset": str(len(text) // 2)},
        )
        assert reply.body.splitlines()[-1] == b'{"exit":%d}' % code, reply
        self.check_processes()

    @rule(rid=sandboxes, name=st.sampled_from(["TERM", "KILL", "INT", "HUP"]))
    def process_signal(self, rid: str, name: str) -> None:
        """A signalled background command ends with ``128 + N``; a second signal is 409."""
        self.count("process_signal")
        process_id = self.start_process(rid, ["sleep", "60"])
        if process_id is None:
            return
        reader = self.follow(rid, process_id)
        base = f"/sandboxes/{rid}/processes/{process_id}/signal"
        self.answered(self.call("POST", base, body={"signal": name}), (204, None))
        number = {"TERM": 15, "KILL": 9, "INT": 2, "HUP": 1}[name]
        assert self.daemon.finish(reader).frames()[-1] == {"exit": 128 + number}
        self.answered(self.call("POST", base, body={"signal": name}), (409, "Conflict"))
        self.answered(self.call("POST", base, body={"signal": "NOPE"}), BAD)
        self.check_processes()

    @rule(rid=sandboxes)
    def kill_under_a_reader(self, rid: str) -> None:
        """Kill a sandbox while a reader follows one of its processes: the reader is told
        ``SandboxNotFound`` in band, and the process is gone."""
        self.count("kill_under_a_reader")
        process_id = self.start_process(rid, ["sleep", "60"])
        if process_id is None:
            return
        reader = self.follow(rid, process_id)
        process = self.daemon.manager.sandboxes[rid].processes.get(process_id)
        spin_until(lambda: bool(process.log._listeners), self.daemon.stub)  # the reader is in
        assert self.call("DELETE", f"/sandboxes/{rid}").status == 204
        frames = self.daemon.finish(reader).frames()
        assert frames == [{"error": "SandboxNotFound", "detail": "the sandbox was killed"}]
        self.forget(rid)
        self.gone(self.call("GET", f"/sandboxes/{rid}/processes/{process_id}/output"))
        self.check_processes()

    def check_processes(self) -> None:
        """No process is left in a killed sandbox's directory; sandbox uids run processes
        only where a live sandbox left a background one.

        (Run after the rules that start or kill processes: a scan of /proc is not cheap.)
        """
        for rid in self.killed[-3:]:
            left = processes_under(self.daemon.layout.directory(rid))
            assert left == [], f"processes left in killed {rid}: {describe(left)}"
        if not self.kernel:
            return
        manager = self.daemon.manager
        expected = {
            manager.sandboxes[rid].identity.uid for rid, s in self.live.items() if s.background
        }
        config = self.daemon.config
        running = processes_by_uid(config.uid_min, config.uid_max)
        pids = [pid for found in running.values() for pid in found]
        # A sandbox that ran a command keeps its zygote until the zygote is retired: a live one
        zygotes = {uid for uid, found in running.items() for pid in found if is_zygote(pid)}
        live = {manager.sandboxes[rid].identity.uid for rid in self.live}
        assert zygotes <= live, (describe(pids), live)
        others = {uid for uid, found in running.items() if not all(map(is_zygote, found))}
        assert others == expected, (describe(pids), expected)

    # Teardown: kill the rest through the API, then look for anything left behind

    def teardown(self) -> None:
        daemon = self.daemon
        try:
            for rid in sorted(self.live):
                reply = self.call("DELETE", f"/sandboxes/{rid}")
                assert reply.status == 204, reply
                self.forget(rid)
            self.check_nothing_left()
        finally:
            daemon.close()
        assert not os.path.exists(daemon.scratch)

    def check_nothing_left(self) -> None:
        daemon = self.daemon
        assert self.call("GET", "/sandboxes").json() == {"sandboxes": []}
        assert daemon.manager.sandboxes == {}
        uids = daemon.isolation.uids
        assert uids.free == uids.total, "uids not returned to the pool"
        assert daemon.layout.leftovers() == [], "sandbox directories left behind"
        # Nothing but the (empty) pins' directory of the namespace layers.
        assert set(os.listdir(daemon.config.root)) <= {".ns"}
        assert daemon.isolation.namespaces.leftovers() == [], "namespace pins left behind"
        assert daemon.isolation.cgroups.leftovers() == [], "cgroups left behind"
        assert processes_under(daemon.config.root) == [], "processes left in a workspace"
        if self.kernel:
            config = daemon.config
            left = processes_with_uids(config.uid_min, config.uid_max)
            assert left == [], f"processes of sandbox uids left: {describe(left)}"
            for instance in daemon.isolation.cgroups._instances():  # type: ignore[attr-defined]
                if self.drained:
                    assert not os.path.exists(instance), f"a drain left {instance}"
                    continue
                left = [n for n in os.listdir(instance) if is_rid(n)]
                assert left == [], f"cgroups left in {instance}: {left}"
