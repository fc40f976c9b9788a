"""Tail latency under noisy neighbours (issue 20): one sandbox's ``exec true`` while another
sandbox of the same isolated daemon does its worst, one load at a time.

The probe is a sandbox of its own, driven over one raw HTTP connection (``rawhttp``) by this
process, back to back. Each row first takes the probe's idle samples (the reference, just before
the load, so that the shared machine's drift touches both alike), then the same count while a
fresh neighbour sandbox runs one load, driven through the daemon's API as a tenant would:

- ``stream``: ``head -c N /dev/zero`` execs, one after the other, their NDJSON read as fast as
  the connection gives it (not decoded);
- ``fork bomb``: every process of a shell loops forking more, held by the sandbox's pids limit;
- ``cpu``: ``busy`` shell loops against the sandbox's CPU quota;
- ``upload``: ``PUT …/file`` of ``upload`` bytes, again and again;
- ``walk``: ``GET …/walk`` of a tree of ``files`` empty files the neighbour made in its
  workspace with one exec, again and again, read at full speed;
- ``terminal``: a terminal whose program prints ``stream`` bytes of text again and again,
  its WebSocket read at full speed (issue 32: a terminal printing without end beside others);
- ``keystrokes``: a terminal whose program echoes what it reads (``cat``, the pty raw), typed
  ``keystroke_rate`` bytes a second in 50-byte WebSocket messages, its echo read as it comes
  (issue 32: 10 000 bytes/s of keystrokes beside others).

The neighbour's client is a process of its own (``python -m sbench.neighbour_driver``), so
that its work takes nothing from this process's interpreter; it and every command inside the
sandbox run under ``timeout -s KILL`` (an outer bound that does not rely on the daemon). After
each row the neighbour is deleted, and no process of its uid may be left (any found is killed by
pid and the row fails).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .neighbour_driver import TREE, exec_body
from .rawhttp import RawHTTP
from .stats import pct

BENCH = Path(__file__).resolve().parents[1]
LOADS = ("stream", "fork bomb", "cpu", "upload", "walk", "terminal", "keystrokes")
TARGET_RATIO = 3.0


def commands(load: str, sizes: Any, bound: int) -> list[str] | None:
    """The argv the neighbour execs for ``load`` (``None``: the load is not an exec)."""
    kill = ["timeout", "-s", "KILL", str(bound)]
    if load == "stream":
        return [*kill, "head", "-c", str(sizes.neighbour_stream_bytes), "/dev/zero"]
    if load == "fork bomb":
        # Every process forks for ever, failed forks retried (perl: the smallest interpreter
        # on every Debian); the first becomes a sleep, so that the exec lasts while it goes on.
        # A quick run's bomb stops after 2^rounds processes: a bomb at the pids limit can stall
        # every fork on the machine for seconds (docs/performance.rst), too long for CI.
        rounds = sizes.neighbour_bomb_rounds
        loop = f"fork while $n++ < {rounds}; sleep {bound}" if rounds else "fork while 1"
        bomb = f"perl -e '{loop}' 2>/dev/null & exec sleep {bound}"
        return [*kill, "sh", "-c", bomb]
    if load == "cpu":
        loops = " ".join(["(while :; do :; done) &"] * sizes.neighbour_busy)
        return [*kill, "sh", "-c", f"{loops} wait"]
    if load == "terminal":
        # Text, as a program at a terminal prints it (the pty's line discipline sees every
        # byte); runs until the bound.
        text = f"head -c {sizes.neighbour_stream_bytes} /dev/zero | tr '\\0' 'x' | fold -w 79"
        return [*kill, "sh", "-c", f"while :; do {text}; done"]
    if load == "keystrokes":
        # A program that reads what is typed and echoes it, the pty raw (every byte passes
        # the line discipline as it comes), as a shell's line editor does; ``ready`` once the
        # pty is raw, before which nothing is typed.
        return [*kill, "sh", "-c", "stty raw -echo && echo ready && exec cat"]
    return None


def tree_command(files: int, bound: int) -> list[str]:
    """An exec that makes ``files`` empty files under ``TREE``, 1000 to a directory."""
    script = (
        "import os, sys\n"
        "n = int(sys.argv[1])\n"
        "for i in range(0, n, 1000):\n"
        f"    d = '.{TREE}/d%04d' % (i // 1000)\n"
        "    os.makedirs(d)\n"
        "    for j in range(min(1000, n - i)):\n"
        "        os.close(os.open('%s/f%04d' % (d, j), os.O_CREAT | os.O_WRONLY, 0o644))\n"
    )
    return ["timeout", "-s", "KILL", str(bound), "python3", "-c", script, str(files)]


# The section, in the bench's process


class Probe:
    """``exec true`` in a sandbox of its own, over one raw connection."""

    def __init__(self, port: int) -> None:
        self.raw = RawHTTP(port)
        self.rid = str(self.raw.json("POST", "/sandboxes", {})["remote_id"])
        self.body = json.dumps({"cmd": ["true"]}).encode()

    def samples(self, count: int, until: Callable[[], bool] | None = None) -> list[float]:
        """``count`` back-to-back execs' seconds (fewer if ``until`` says stop first)."""
        out: list[float] = []
        for _ in range(count):
            if until is not None and until():
                break
            self.raw.ready()
            start = time.perf_counter()
            status, data = self.raw.request("POST", f"/sandboxes/{self.rid}/exec", self.body)
            out.append(time.perf_counter() - start)
            if status != 200 or b'"exit":0' not in data:
                raise RuntimeError(f"probe exec true: HTTP {status}: {data[-200:]!r}")
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.json("DELETE", f"/sandboxes/{self.rid}")
        self.raw.close()


def uid_processes(uid: int) -> list[int]:
    """Pids of the processes whose real uid is ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(entry.name))
                        break
    return found


class Neighbour:
    """A fresh sandbox with one load, driven by its own ``timeout -s KILL`` process."""

    def __init__(self, port: int, load: str, sizes: Any, bound: int) -> None:
        self.port = port
        self.load = load
        self.bound = bound
        self.raw = RawHTTP(port)
        self.rid = str(self.raw.json("POST", "/sandboxes", {})["remote_id"])
        self.uid = int(self.exec_output(["id", "-u"]))
        self.params: dict[str, Any] = {"bound": bound, "cmd": commands(load, sizes, bound)}
        if load == "keystrokes":
            self.params["rate"] = sizes.neighbour_keystroke_rate
        if load == "upload":
            self.params["bytes"] = sizes.neighbour_upload_bytes
        if load == "walk":
            self.exec_output(tree_command(sizes.neighbour_files, bound))
            status, data = self.raw.request("GET", f"/sandboxes/{self.rid}/walk?root={TREE}")
            listed = len(json.loads(data)["entries"]) if status == 200 else -1
            if listed != sizes.neighbour_files:
                raise RuntimeError(f"walk tree: {listed} of {sizes.neighbour_files} files")
        self.driver: subprocess.Popen[str] | None = None

    def exec_output(self, cmd: list[str]) -> str:
        import base64

        status, data = self.raw.request(
            "POST", f"/sandboxes/{self.rid}/exec", exec_body(cmd, self.bound)
        )
        frames = [json.loads(line) for line in data.splitlines() if line.strip()]
        if status != 200 or frames[-1].get("exit") != 0:
            raise RuntimeError(f"neighbour {cmd[:6]}: HTTP {status}: {data[-300:]!r}")
        return b"".join(base64.b64decode(f.get("o", "")) for f in frames[:-1]).decode()

    def start(self) -> None:
        argv = ["timeout", "-s", "KILL", str(self.bound), sys.executable, "-m"]
        argv += [
            "sbench.neighbour_driver",
            str(self.port),
            self.rid,
            self.load,
            json.dumps(self.params),
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(BENCH.parent)])}
        # A session of its own: if the driver outlives its stop, its whole group is killed.
        self.driver = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        assert self.driver.stdout is not None
        line = self.driver.stdout.readline().strip()
        if line != "started":
            raise RuntimeError(f"neighbour {self.load}: driver said {line!r}")

    def running(self) -> bool:
        return self.driver is not None and self.driver.poll() is None

    def stats(self) -> dict[str, Any]:
        return dict(self.raw.json("GET", f"/sandboxes/{self.rid}/stats"))

    def stop(self) -> dict[str, Any]:
        """Stop the driver (SIGTERM; SIGKILL to its process group after 10 s) and its summary."""
        summary: dict[str, Any] = {}
        if self.driver is not None:
            if self.driver.poll() is None:
                self.driver.send_signal(signal.SIGTERM)
            try:
                out, _ = self.driver.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(self.driver.pid, signal.SIGKILL)
                out, _ = self.driver.communicate()
            lines = out.strip().splitlines()
            if lines:
                summary = json.loads(lines[-1])
        return summary

    def remove(self) -> list[int]:
        """Delete the sandbox; the pids of its uid still alive after it (killed here)."""
        with contextlib.suppress(Exception):
            self.stop()
        try:
            self.raw.json("DELETE", f"/sandboxes/{self.rid}")
        finally:
            self.raw.close()
        deadline = time.monotonic() + 5
        while (left := uid_processes(self.uid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return left


def measure(port: int, load: str, sizes: Any, probe: Probe) -> dict[str, Any]:
    """Idle samples, then the same count under ``load``; with what the neighbour did."""
    count = sizes.neighbour_samples
    bound = sizes.neighbour_bound
    neighbour = Neighbour(port, load, sizes, bound)
    try:
        idle = probe.samples(count)
        neighbour.start()
        time.sleep(sizes.neighbour_ramp)
        before = neighbour.stats()
        began = time.perf_counter()
        loaded = probe.samples(count, until=lambda: not neighbour.running())
        seconds = time.perf_counter() - began
        after = neighbour.stats()
        if not neighbour.running():
            raise RuntimeError(f"neighbour {load}: the driver ended early ({neighbour.stop()})")
        summary = neighbour.stop()
    finally:
        left = neighbour.remove()
    if left:
        raise RuntimeError(f"neighbour {load}: {len(left)} processes of its uid outlived it")
    cpu = ((after["cpu_usec"] or 0) - (before["cpu_usec"] or 0)) / 1e6
    return {
        "idle": idle,
        "loaded": loaded,
        "seconds": seconds,
        "neighbour": {
            **summary,
            "pids": [before["pids"], after["pids"]],
            "cpu_cores": cpu / seconds if seconds else None,
        },
    }


def section(bench: Any) -> None:
    """The neighbour rows against the isolated daemon (``bench``: a ``figures.Bench``)."""
    d = bench.daemons.get("isolated")
    if d is None:
        bench.notes.append("neighbour rows skipped: no isolated daemon")
        return
    probe = Probe(d.server.port)
    try:
        measured = {
            load: measure(d.server.port, load, bench.sizes, probe) for load in chosen(bench.sizes)
        }
    finally:
        probe.close()
    add_rows(bench, measured)


def chosen(sizes: Any) -> list[str]:
    """The loads of ``sizes.neighbour_loads``, in the order of :data:`LOADS`; an unknown name
    is an error (a misspelt one would measure nothing and say nothing)."""
    names = [name.strip() for name in sizes.neighbour_loads.split(",") if name.strip()]
    unknown = sorted(set(names) - set(LOADS))
    if unknown:
        raise ValueError(f"neighbour_loads: no such load: {', '.join(unknown)} (of {LOADS})")
    return [load for load in LOADS if load in names]


def describe(load: str, sizes: Any) -> str:
    mib = 1 << 20
    return {
        "stream": f"streams head -c {sizes.neighbour_stream_bytes // mib} MiB, again and again",
        "fork bomb": (
            f"fork-bombs to {2**sizes.neighbour_bomb_rounds} processes"
            if sizes.neighbour_bomb_rounds
            else "fork-bombs to its pids limit"
        ),
        "cpu": f"burns {sizes.neighbour_busy} busy loops against its CPU quota",
        "upload": f"uploads {sizes.neighbour_upload_bytes // mib} MiB, again and again",
        "walk": f"walks {sizes.neighbour_files} files, again and again",
        "terminal": "prints text on a terminal without end, its WebSocket read",
        "keystrokes": (
            f"is typed {sizes.neighbour_keystroke_rate} bytes/s on a terminal, its echo read"
        ),
    }[load]


def add_rows(bench: Any, measured: dict[str, dict[str, Any]]) -> None:
    """One row per load: the probe's p50 and p99 under it, its idle p99 (just before) as the
    reference, the ratio of p99s judged against ``TARGET_RATIO`` (a full run only)."""
    from .figures import at_most

    for load, m in measured.items():
        idle99 = pct(m["idle"], 0.99) * 1e3
        p50, p99 = pct(m["loaded"], 0.5) * 1e3, pct(m["loaded"], 0.99) * 1e3
        bench.row(
            "exec true beside a neighbour (p99 / idle p99)",
            f"isolated: neighbour {describe(load, bench.sizes)}",
            p50,
            "ms",
            ref="idle p99",
            ref_value=idle99,
            ratio_of=p99,
            target=None if bench.sizes.quick else at_most(TARGET_RATIO),
            on="ratio",
            extra={
                "p99_ms": p99,
                "idle_p50_ms": pct(m["idle"], 0.5) * 1e3,
                "max_ms": max(m["loaded"]) * 1e3,
                "n": len(m["loaded"]),
                "seconds": m["seconds"],
                "neighbour": m["neighbour"],
            },
        )
