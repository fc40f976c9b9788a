"""The figures of issue 9, each measured beside its references in the same run.

Latencies are measured in interleaved rounds (every variant a few times, then the next
variant, round after round), so that the machine's load drifts over all of them alike; the
figure is the median (p50) over every round, and the ratio is the ratio of p50s.

``client`` rows drive sandboxd with ``sandboxd_client.HttpSandbox`` (treq); ``raw`` rows drive
sandboxd or the peer with the same thin blocking ``http.client`` connection (``rawhttp``).
"""

import base64
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pybase64
from twisted.internet.defer import Deferred, DeferredList, DeferredSemaphore
from twisted.internet.task import LoopingCall, deferLater

from sandboxd_client import HttpSandbox, decode_handle

from . import (
    bursts,
    contexts,
    density,
    dockerd,
    e2bsuite,
    egress,
    floor,
    limits,
    neighbours,
    procs,
    templates,
    terminals,
    versus,
)
from .rawhttp import CHUNK, RawHTTP
from .stats import median, summary

MB = 1_000_000
MiB = 1 << 20
MAX_OUTPUT = 16 * MiB
"""The daemons' ``max_output`` (their default): output kept for the final frame."""
STREAM_CLIENTS = ("client", "raw", "raw, not decoded")


class Sizes:
    """How much each figure does: ``quick`` (CI: the harness works) or full (the issue's)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.rounds = 3 if quick else 20
        self.per_round = 4 if quick else 10
        self.stream_bytes = 8 * MiB if quick else 512 * MiB
        self.stream_reps = 1 if quick else 3
        self.transfer_bytes = 8 * MiB if quick else 1024 * MiB
        self.peer_transfer_bytes = 8 * MiB if quick else 256 * MiB
        self.transfer_reps = 1 if quick else 2
        self.walk_files = 2_000 if quick else 100_000
        self.walk_reps = 2 if quick else 3
        self.idle = 30 if quick else 2_000
        self.idle_warmup = 10 if quick else 200
        self.concurrency = 8
        self.sleepers = 20 if quick else 100
        self.sleep = 0.5 if quick else 1.0
        self.sleep_reps = 1 if quick else 3
        self.docker_rounds = 1 if quick else 20
        self.docker_per_round = 1 if quick else 3
        self.docker_idle = 2 if quick else 50
        self.docker_parallel = 2 if quick else 32
        self.docker_execs = 1 if quick else 4
        self.sandboxd_execs = 2 if quick else 25
        self.docker_throughput_reps = 1 if quick else 3
        self.density = 20 if quick else 10_000
        self.density_in_flight = 4 if quick else 8
        self.density_cold = 5 if quick else 200
        self.density_image_mib = 256 if quick else 8192
        self.density_seconds = 60.0 if quick else 900.0
        """The fill starts no create after this long (its rows say how many it made)."""
        self.bursts_single = 5 if quick else 100
        self.bursts = "5" if quick else "100,1000"
        """Sandboxes asked for at once in each burst, comma-separated (``--set bursts=100``)."""
        self.bursts_image_mib = 256 if quick else 4096
        self.netns_pool = 0
        """``SANDBOXD_NETNS_POOL`` of the density and bursts daemons (``--set netns_pool=64``)."""
        self.template_rounds = 3 if quick else 100
        self.template_forks = 3 if quick else 20
        self.template_fork_bytes = 8 * MiB if quick else 1024 * MiB
        self.template_image_mib = 512 if quick else 8192
        self.neighbour_samples = 10 if quick else 2000
        """Probe execs idle, then as many beside each neighbour: the p99 of 400 (the fourth
        worst) moved a ratio from 2.2 to 4.0 between identical runs (docs/performance.rst)."""
        self.neighbour_ramp = 0.1 if quick else 1.0
        self.neighbour_bound = 60 if quick else 240
        self.neighbour_stream_bytes = 4 * MiB if quick else 256 * MiB
        self.neighbour_busy = 2 if quick else 4
        self.neighbour_bomb_rounds = 5 if quick else 0
        """Forks of each process of the fork bomb (0: for ever, held by the pids limit)."""
        self.neighbour_upload_bytes = 4 * MiB if quick else 1024 * MiB
        self.neighbour_files = 500 if quick else 100_000
        self.neighbour_keystroke_rate = 10_000
        """Bytes a second the ``keystrokes`` neighbour types on its terminal (issue 32)."""
        self.neighbour_loads = "stream,fork bomb,cpu,upload,walk,terminal,keystrokes"
        """The neighbour loads measured, comma-separated (``--set neighbour_loads=upload``)."""
        self.egress_rounds = 2 if quick else 10
        self.egress_requests = 20 if quick else 100
        """Small requests measured per round and sandbox (``egress``)."""
        self.egress_bulk_bytes = 8 * MiB if quick else 64 * MiB


class PeakWatch:
    """The largest RSS of a process between ``start`` and ``stop`` (``VmHWM`` when it can be
    reset, else samples every 10 ms), and its RSS before."""

    def __init__(self, reactor: Any, pid: int) -> None:
        self.reactor = reactor
        self.pid = pid
        self.before = 0
        self.peak = 0
        self.hwm = False
        self.loop: LoopingCall | None = None

    def start(self) -> None:
        self.before = procs.status_kib(self.pid)
        self.peak = self.before
        self.hwm = procs.reset_peak(self.pid)
        self.loop = LoopingCall(self._sample)
        self.loop.clock = self.reactor
        self.loop.start(0.01)

    def _sample(self) -> None:
        self.peak = max(self.peak, procs.status_kib(self.pid))

    def stop(self) -> dict[str, int]:
        """RSS before, peak and after, and the peak growth, in KiB."""
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        self._sample()
        if self.hwm:
            self.peak = max(self.peak, procs.status_kib(self.pid, "VmHWM"))
        after = procs.status_kib(self.pid)
        return {
            "rss_before_kib": self.before,
            "rss_peak_kib": self.peak,
            "rss_after_kib": after,
            "growth_kib": self.peak - self.before,
        }


HELPER_FLOOR = "floor: helper cgroup+setsid+uid+cd true (isolated's argv)"
"""The spawn of ``true`` as the isolated daemon's helper does it, without the daemon."""


class Target:
    def __init__(self, text: str, check: Callable[[float], bool]) -> None:
        self.text = text
        self.check = check


def at_most(limit: float, unit: str = "") -> Target:
    return Target(f"≤ {limit:g}{unit}", lambda v: v <= limit)


def at_least(limit: float, unit: str = "") -> Target:
    return Target(f"≥ {limit:g}{unit}", lambda v: v >= limit)


class Sandboxd:
    """One daemon under test, with both kinds of client and a long-lived sandbox."""

    def __init__(self, label: str, server: procs.Server, reactor: Any) -> None:
        self.label = label
        self.server = server
        self.client = HttpSandbox(server.url, reactor=reactor, max_persistent_per_host=128)
        self.raw = RawHTTP(server.port)
        self.handle: Any = None
        self.rid = ""
        self.made: list[Any] = []
        """Sandboxes the create variants made, killed after each batch (``Bench.reap``)."""

    async def open(self) -> None:
        self.handle = await self.client.create()
        self.rid = decode_handle(self.handle).remote_id

    @property
    def workspace(self) -> Path:
        assert self.server.root is not None
        return self.server.root / self.rid / "workspace"

    def path(self, route: str, **query: str) -> str:
        from urllib.parse import urlencode

        tail = f"?{urlencode(query)}" if query else ""
        return f"/sandboxes/{self.rid}/{route}{tail}"

    async def close(self) -> None:
        if self.handle is not None:
            await self.client.kill(self.handle)
        self.raw.close()
        await self.client.close()


class Bench:
    """Runs every figure; collects rows and notes."""

    def __init__(self, reactor: Any, sizes: Sizes, workdir: Path) -> None:
        self.reactor = reactor
        self.sizes = sizes
        self.workdir = workdir
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.floors: floor.Floors | None = None
        self.daemons: dict[str, Sandboxd] = {}
        self.peer: RawHTTP | None = None
        self.peer_server: procs.Server | None = None
        self.dockerd: dockerd.Dockerd | None = None
        """The bench's own dockerd when Docker's rows run (``docker`` section)."""
        self.e2b_mirror: str | None = None
        """The git directory of a mirror of e2b-dev/E2B (``e2b_suite`` section)."""

    # Rows

    def row(
        self,
        figure: str,
        variant: str,
        value: float,
        unit: str,
        *,
        ref: str | None = None,
        ref_value: float | None = None,
        target: Target | None = None,
        on: str = "value",
        ratio_of: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Record one figure; ``on`` says whether the target applies to the value or the ratio.
        A figure that misses its target says what limits it (:mod:`sbench.limits`).

        The ratio is value / reference for times, reference / value for rates (MB/s, /s): above
        1 is always slower than the reference. ``ratio_of`` takes the ratio of another figure
        than the value (a p99 beside a p50 value).
        """
        ratio = None
        of = value if ratio_of is None else ratio_of
        if ref_value:
            rate = unit.endswith("/s")
            ratio = (ref_value / of if of else float("inf")) if rate else of / ref_value
        met = None
        if target is not None:
            subject = ratio if on == "ratio" else value
            met = None if subject is None else bool(target.check(subject))
        row = {
            "figure": figure,
            "variant": variant,
            "value": value,
            "unit": unit,
            "ref": ref,
            "ref_value": ref_value,
            "ratio": ratio,
            "target": None if target is None else target.text + (" x ref" if on == "ratio" else ""),
            "met": met,
            **(extra or {}),
        }
        if met is False and (why := limits.limited_by(figure, variant)) is not None:
            row["limited_by"] = why
        self.rows.append(row)
        return row

    def value(self, figure: str, variant: str) -> float | None:
        for row in self.rows:
            if row["figure"] == figure and row["variant"] == variant:
                return float(row["value"])
        return None

    async def settle(self) -> None:
        """Let the reactor run a moment: after blocking work (the raw client, the floors) the
        client's pool must see the connections the server closed meanwhile (twisted.web
        closes idle ones after 60 s) before it hands one out."""
        for _ in range(3):
            await deferLater(self.reactor, 0.01, lambda: None)

    # Latency rounds

    async def rounds(
        self, variants: dict[str, Callable[[], Awaitable[float] | float]]
    ) -> dict[str, list[float]]:
        """Interleaved samples (seconds) of every variant; one warm-up call each first."""
        samples: dict[str, list[float]] = {name: [] for name in variants}

        async def once(call: Callable[[], Awaitable[float] | float]) -> float:
            result = call()
            if isinstance(result, float):
                return result
            return await result

        for call in variants.values():
            await once(call)
        await self.reap()
        for _ in range(self.sizes.rounds):
            for name, call in variants.items():
                for _ in range(self.sizes.per_round):
                    samples[name].append(await once(call))
                await self.reap()
        return samples

    async def reap(self) -> None:
        """Kill the sandboxes the create variants made, out of their timing, and give the kernel
        a moment to finish with their cgroups (a kill leaves it work that slows whatever runs
        right after it: an exec just after a kill here takes half as long again)."""
        for d in self.daemons.values():
            handles, d.made = d.made, []
            if handles:
                await self._kill_many(d, handles)
                await deferLater(self.reactor, 0.1, lambda: None)

    def spawn_variants(self) -> dict[str, Callable[[], float]]:
        f = self.floors
        assert f is not None
        env, senv = f.env, f.spawn_env()
        variants: dict[str, Callable[[], float]] = {
            "floor: /bin/true direct": lambda: floor.run(f.direct(), env)[0],
            "floor: setsid sh(cd) true (none's shell chain)": lambda: floor.run(
                f.none_chain(), env
            )[0],
        }
        none_helper = f.none_helper()
        if none_helper is not None:
            variants["floor: helper session+cd true (none's argv)"] = lambda: floor.run(
                none_helper, env
            )[0]
        if f.isolated:
            variants["floor: wrapper (cgroup+setsid+setpriv) true"] = lambda: floor.run(
                f.wrapper_floor(), senv
            )[0]
            variants["floor: wrapper sh(cd) true (isolated's shell chain)"] = lambda: floor.run(
                f.isolated_chain(), senv
            )[0]
            helper = f.isolated_helper()
            unfiltered = f.isolated_helper(seccomp=False)
            if helper is not None and unfiltered is not None:
                variants[HELPER_FLOOR] = lambda: floor.run(helper, senv)[0]
                variants["floor: the same, --seccomp=off (SANDBOXD_SECCOMP=off)"] = lambda: (
                    floor.run(unfiltered, senv)[0]
                )
        return variants

    async def latency(self) -> None:
        """exec ``true``, create, create + first exec, and the floors of HTTP and spawning."""
        variants: dict[str, Callable[[], Any]] = dict(self.spawn_variants())
        for label, d in self.daemons.items():
            variants[f"{label}: HTTP GET /healthz (raw)"] = self._healthz(d)
            variants[f"{label}: exec true (raw)"] = self._raw_exec(d)
            variants[f"{label}: exec true (client)"] = self._client_exec(d)
            variants[f"{label}: create (client)"] = self._create(d, first_exec=False)
            variants[f"{label}: create + exec true (client)"] = self._create(d, first_exec=True)
        if self.peer is not None:
            peer = self.peer
            variants["peer: HTTP GET /is_alive (raw)"] = lambda: peer.timed("GET", "/is_alive")
            variants["peer: exec true (raw)"] = lambda: peer.timed(
                "POST", "/execute", {"command": ["true"], "shell": False}
            )
        samples = await self.rounds(variants)
        p50 = {name: summary(s)["p50"] for name, s in samples.items()}

        def ms(name: str) -> float:
            return p50[name] * 1000

        def stats_of(name: str) -> dict[str, Any]:
            s = summary(samples[name])
            return {"p90_ms": s["p90"] * 1000, "min_ms": s["min"] * 1000, "n": s["n"]}

        direct = "floor: /bin/true direct"
        wrapper = "floor: wrapper (cgroup+setsid+setpriv) true"
        for name in self.spawn_variants():
            ref = None if name == direct else direct
            self.row(
                "spawn true (floor)",
                name.removeprefix("floor: "),
                ms(name),
                "ms",
                ref=ref,
                ref_value=None if ref is None else ms(ref),
                extra=stats_of(name),
            )
        peer_exec = "peer: exec true (raw)" if self.peer is not None else None
        if self.peer is not None:
            self.row(
                "HTTP round trip (floor)",
                "peer GET /is_alive (raw)",
                ms("peer: HTTP GET /is_alive (raw)"),
                "ms",
                extra=stats_of("peer: HTTP GET /is_alive (raw)"),
            )
            self.row(
                "exec true",
                "peer (raw)",
                ms("peer: exec true (raw)"),
                "ms",
                ref="floor: /bin/true direct",
                ref_value=ms(direct),
                extra=stats_of("peer: exec true (raw)"),
            )
        for label in self.daemons:
            self.row(
                "HTTP round trip (floor)",
                f"{label} GET /healthz (raw)",
                ms(f"{label}: HTTP GET /healthz (raw)"),
                "ms",
                extra=stats_of(f"{label}: HTTP GET /healthz (raw)"),
            )
            for how in ("raw", "client"):
                name = f"{label}: exec true ({how})"
                if label == "isolated":
                    self.row(
                        "exec true",
                        f"{label} ({how})",
                        ms(name),
                        "ms",
                        ref="wrapper floor",
                        ref_value=ms(wrapper) if wrapper in p50 else None,
                        target=at_most(1.5),
                        on="ratio",
                        extra=stats_of(name),
                    )
                else:
                    peer_ms = ms(peer_exec) if peer_exec else None
                    self.row(
                        "exec true",
                        f"{label} ({how})",
                        ms(name),
                        "ms",
                        ref="peer (raw)",
                        ref_value=peer_ms,
                        target=at_most(1.0) if peer_ms else None,
                        on="ratio",
                        extra=stats_of(name),
                    )
            if label == "isolated" and HELPER_FLOOR in p50:
                # Issue 20: exec ≤ 1.3x its parts, the spawn through the helper and one round trip.
                name = f"{label}: exec true (raw)"
                self.row(
                    "exec true beside its parts",
                    f"{label} (raw)",
                    ms(name),
                    "ms",
                    ref="helper floor + GET /healthz",
                    ref_value=ms(HELPER_FLOOR) + ms(f"{label}: HTTP GET /healthz (raw)"),
                    target=at_most(1.3),
                    on="ratio",
                    extra=stats_of(name),
                )
            name = f"{label}: create (client)"
            self.row(
                "create → usable handle",
                f"{label} (client)",
                ms(name),
                "ms",
                ref="own GET /healthz (raw)",
                ref_value=ms(f"{label}: HTTP GET /healthz (raw)"),
                target=at_most(5, " ms"),
                extra=stats_of(name),
            )
            name = f"{label}: create + exec true (client)"
            self.row(
                "create + first exec",
                f"{label} (client)",
                ms(name),
                "ms",
                ref="own exec true (client)",
                ref_value=ms(f"{label}: exec true (client)"),
                target=at_most(10, " ms"),
                extra=stats_of(name),
            )

    def _healthz(self, d: Sandboxd) -> Callable[[], float]:
        return lambda: d.raw.timed("GET", "/healthz")

    def _raw_exec(self, d: Sandboxd) -> Callable[[], float]:
        body = json.dumps({"cmd": ["true"]}).encode()
        headers = {"Content-Type": "application/json"}

        def call() -> float:
            d.raw.ready()
            start = time.perf_counter()
            status, data = d.raw.request("POST", d.path("exec"), body, headers)
            elapsed = time.perf_counter() - start
            if status != 200 or b'"exit":0' not in data:
                raise RuntimeError(f"exec true: HTTP {status}: {data[-200:]!r}")
            return elapsed

        return call

    def _client_exec(self, d: Sandboxd) -> Callable[[], Awaitable[float]]:
        async def call() -> float:
            start = time.perf_counter()
            result = await d.client.exec(d.handle, ["true"])
            elapsed = time.perf_counter() - start
            if result.exit_code != 0:
                raise RuntimeError(f"exec true exited {result.exit_code}: {result.stderr!r}")
            return elapsed

        return call

    def _create(self, d: Sandboxd, first_exec: bool) -> Callable[[], Awaitable[float]]:
        async def call() -> float:
            start = time.perf_counter()
            handle = await d.client.create()
            if first_exec:
                result = await d.client.exec(handle, ["true"])
                if result.exit_code != 0:
                    raise RuntimeError(f"first exec exited {result.exit_code}")
            elapsed = time.perf_counter() - start
            d.made.append(handle)
            return elapsed

        return call

    async def docker(self) -> None:
        """Docker beside sandboxd: create, execs, kill, idle memory, throughput (``versus``)."""
        versus.section(self)

    async def density(self) -> None:
        """Many idle sandboxes with every layer on: their costs, the create rate (``density``)."""
        density.section(self)

    async def neighbours(self) -> None:
        """Another sandbox's exec ``true`` while a neighbour does its worst (``neighbours``)."""
        neighbours.section(self)

    async def terminals(self) -> None:
        """Keystroke echo on a terminal's WebSocket, the ports proxy's overhead (``terminals``)."""
        terminals.section(self)

    async def bursts(self) -> None:
        """Create → first output alone and in bursts, every layer on (``bursts``)."""
        bursts.section(self)

    async def templates(self) -> None:
        """Create from a template and fork, every layer on, beside Docker (``templates``)."""
        templates.section(self)

    async def egress(self) -> None:
        """A small request's latency and a download's throughput from a sandbox, direct and
        through the egress proxy (``egress``)."""
        egress.section(self)

    async def contexts(self) -> None:
        """``run_code`` warm and cold, native and through the E2B SDK (``contexts``)."""
        contexts.section(self)

    async def e2b_suite(self) -> None:
        """E2B's own SDK suite against the front, once per SDK release (``e2bsuite``)."""
        e2bsuite.section(self, self.e2b_mirror, "isolated" in self.daemons)

    # Idle sandboxes and sustained creates

    async def idle(self) -> None:
        """Fill each daemon with idle sandboxes: creates/s sustained, and memory per sandbox."""
        n = self.sizes.idle
        for label, d in self.daemons.items():
            # Warm the daemon's allocator and connections first: their one-off growth is not
            # per-sandbox memory.
            await self.settle()
            await self._create_many(d, self.sizes.idle_warmup, kill=True)
            await deferLater(self.reactor, 0.5, lambda: None)
            before = d.server.rss_kib()
            start = time.perf_counter()
            handles = await self._create_many(d, n, kill=False)
            wall = time.perf_counter() - start
            await deferLater(self.reactor, 0.5, lambda: None)
            after = d.server.rss_kib()
            live = len(d.raw.json("GET", "/sandboxes")["sandboxes"])
            start = time.perf_counter()
            await self._kill_many(d, handles)
            kill_wall = time.perf_counter() - start
            per = (after - before) / n
            self.row(
                "creates sustained",
                f"{label} (client, {self.sizes.concurrency} in flight)",
                n / wall,
                "/s",
                target=at_least(200, "/s"),
                extra={"count": n, "wall_s": wall},
            )
            self.row(
                "idle sandboxes live",
                f"{label}",
                float(live),
                "sandboxes",
                target=at_least(n),
                extra={"kills_per_s": n / kill_wall},
            )
            self.row(
                "daemon memory per idle sandbox",
                f"{label} (RSS growth / {n})",
                per,
                "KiB",
                target=at_most(20, " KiB"),
                extra={"rss_before_kib": before, "rss_after_kib": after},
            )

    async def _create_many(self, d: Sandboxd, n: int, kill: bool) -> list[Any]:
        gate = DeferredSemaphore(self.sizes.concurrency)
        handles: list[Any] = []

        async def one() -> None:
            handle = await d.client.create()
            if kill:
                await d.client.kill(handle)
            else:
                handles.append(handle)

        calls = [gate.run(lambda: Deferred.fromCoroutine(one())) for _ in range(n)]
        results = await DeferredList(calls, consumeErrors=True)
        failed = [r for ok, r in results if not ok]
        if failed:
            await self._kill_many(d, handles)
            raise RuntimeError(f"{len(failed)} of {n} creates failed: {failed[0]}")
        return handles

    async def _kill_many(self, d: Sandboxd, handles: list[Any]) -> None:
        gate = DeferredSemaphore(self.sizes.concurrency)
        calls = [gate.run(d.client.kill, h) for h in handles]
        await DeferredList(calls, consumeErrors=True)

    # Streaming output

    async def streaming(self) -> None:
        """``head -c N /dev/zero``: decoded MB/s, and the daemon's memory at N/4 and N."""
        big = self.sizes.stream_bytes
        f = self.floors
        assert f is not None
        head = shutil.which("head") or "/usr/bin/head"
        runs: dict[str, list[float]] = {"floor": []}
        growth: dict[str, dict[int, list[int]]] = {}
        for label in self.daemons:
            for how in STREAM_CLIENTS:
                runs[f"{label} ({how})"] = []
            growth[label] = {big // 4: [], big: []}
        for _ in range(self.sizes.stream_reps):
            seconds, got, _ = floor.run([head, "-c", str(big), "/dev/zero"], f.env)
            assert got == big, got
            runs["floor"].append(big / seconds / MB)
            for label, d in self.daemons.items():
                for size in (big // 4, big):
                    watch = PeakWatch(self.reactor, d.server.pid)
                    watch.start()
                    rate = await self._client_stream(d, size)
                    growth[label][size].append(watch.stop()["growth_kib"])
                    if size == big:
                        runs[f"{label} (client)"].append(rate)
                runs[f"{label} (raw)"].append(self._raw_stream(d, big))
                runs[f"{label} (raw, not decoded)"].append(self._raw_stream(d, big, False))
        ref = median(runs["floor"])
        self.row(
            "exec output streamed (floor)",
            "head -c N /dev/zero | pipe",
            ref,
            "MB/s",
            extra={"bytes": big},
        )
        for codec in (base64, pybase64):
            encode, decode = base64_rates(codec)
            for name, rate in (("encode", encode), ("decode", decode)):
                self.row(
                    "exec output streamed (floor)",
                    f"{codec.__name__} {name} of 1 MiB chunks, one core",
                    rate,
                    "MB/s",
                    extra={"note": "the wire format's cost: every live byte is coded twice"},
                )
        for label in self.daemons:
            for how in STREAM_CLIENTS:
                self.row(
                    "exec output streamed",
                    f"{label} ({how})",
                    median(runs[f"{label} ({how})"]),
                    "MB/s",
                    ref="floor (pipe)",
                    ref_value=ref,
                    target=at_least(200, " MB/s"),
                    extra={"bytes": big},
                )
            small, large = (median(growth[label][s]) / 1024 for s in (big // 4, big))
            # Up to max_output (16 MiB by default) the output is also kept for the last frame:
            # memory is only expected to stay flat beyond it.
            flat = Target("flat: N vs N/4 < 10 MiB", versus.within(small + 10))
            self.row(
                "daemon memory while streaming",
                f"{label}: peak growth at N (N/4: {small:.1f} MiB)",
                large,
                "MiB",
                target=flat if big // 4 > MAX_OUTPUT else None,
                extra={"growth_quarter_mib": small, "bytes": big},
            )

    async def _client_stream(self, d: Sandboxd, size: int) -> float:
        await self.settle()
        got = [0]

        def count(chunk: bytes) -> None:
            got[0] += len(chunk)

        start = time.perf_counter()
        result = await d.client.exec(
            d.handle, ["head", "-c", str(size), "/dev/zero"], on_output=count
        )
        elapsed = time.perf_counter() - start
        if result.exit_code != 0 or got[0] != size:
            raise RuntimeError(f"stream: exit {result.exit_code}, {got[0]} of {size} bytes")
        return size / elapsed / MB

    def _raw_stream(self, d: Sandboxd, size: int, decode: bool = True) -> float:
        """The same through ``http.client``, decoding each live frame (base64) as it comes, or
        not (``decode=False``: the daemon's own rate, with no decoding in the way)."""
        got = [0]
        pending: list[bytes] = []
        prefix = b'{"o":"'

        def sink(chunk: bytes) -> None:
            if not decode:
                got[0] += len(chunk)
                return
            if b"\n" not in chunk:
                pending.append(chunk)  # (the final frame is one line of megabytes)
                return
            lines = (b"".join(pending) + chunk).split(b"\n")
            pending[:] = [lines.pop()]
            for line in lines:
                if line.startswith(prefix):
                    got[0] += len(pybase64.b64decode(memoryview(line)[len(prefix) : -2]))

        body = json.dumps({"cmd": ["head", "-c", str(size), "/dev/zero"]}).encode()
        d.raw.ready()
        start = time.perf_counter()
        status, _ = d.raw.request("POST", d.path("exec"), body, sink=sink)
        elapsed = time.perf_counter() - start
        if status != 200 or got[0] < size or (decode and got[0] != size):
            raise RuntimeError(f"raw stream: HTTP {status}, {got[0]} of {size} bytes")
        return size / elapsed / MB

    # Upload and download

    async def transfers(self) -> None:
        """Upload and download of one file: MB/s and the daemon's peak RSS growth."""
        size = self.sizes.transfer_bytes
        source = self.workdir / "transfer.bin"
        make_file(source, size)
        received = self.workdir / "received.bin"
        rates: dict[str, list[float]] = {"floor": []}
        growth: dict[str, list[int]] = {}
        ops = ("upload (client)", "upload (raw)", "download (client)", "download (raw)")
        for label in self.daemons:
            for op in ops:
                rates[f"{label} {op}"] = []
                growth[f"{label} {op}"] = []
        peer_size = min(size, self.sizes.peer_transfer_bytes)
        peer_source = self.workdir / "peer-source.bin"
        if self.peer is not None:
            make_file(peer_source, peer_size)
            rates["peer upload (raw)"] = []
            rates["peer download (raw)"] = []
        for _ in range(self.sizes.transfer_reps):
            rates["floor"].append(copy_rate(source, received))
            for label, d in self.daemons.items():
                for op in ops:
                    watch = PeakWatch(self.reactor, d.server.pid)
                    watch.start()
                    rate = await self._transfer(d, op, source, received, size)
                    growth[f"{label} {op}"].append(watch.stop()["growth_kib"])
                    rates[f"{label} {op}"].append(rate)
            if self.peer is not None:
                rates["peer upload (raw)"].append(self._peer_upload(peer_source, peer_size))
                rates["peer download (raw)"].append(self._peer_download(peer_size))
        received.unlink(missing_ok=True)
        source.unlink()
        peer_source.unlink(missing_ok=True)
        ref = median(rates["floor"])
        self.row(
            "upload/download (floor)",
            "local copy, read+write 1 MiB",
            ref,
            "MB/s",
            extra={"bytes": size},
        )
        if self.peer is not None:
            for op in ("upload", "download"):
                self.row(
                    "upload/download",
                    f"peer {op} (raw)",
                    median(rates[f"peer {op} (raw)"]),
                    "MB/s",
                    ref="floor (copy)",
                    ref_value=ref,
                    extra={"bytes": peer_size},
                )
        for label in self.daemons:
            for op in ops:
                key = f"{label} {op}"
                grown = max(growth[key]) / 1024
                self.row(
                    "upload/download",
                    key,
                    median(rates[key]),
                    "MB/s",
                    ref="floor (copy)",
                    ref_value=ref,
                    target=at_least(300, " MB/s"),
                    extra={"bytes": size, "rss_growth_mib": grown},
                )
                self.row(
                    "daemon RSS growth in transfer",
                    key,
                    grown,
                    "MiB",
                    target=at_most(10, " MiB"),
                    extra={"bytes": size},
                )

    async def _transfer(
        self, d: Sandboxd, op: str, source: Path, received: Path, size: int
    ) -> float:
        name = "/bench/transfer.bin"
        await self.settle()
        d.raw.ready()
        start = time.perf_counter()
        if op == "upload (client)":
            await d.client.upload_file(d.handle, name, str(source))
        elif op == "upload (raw)":
            with open(source, "rb") as f:
                status, data = d.raw.request(
                    "PUT",
                    d.path("file", path=name),
                    f,
                    {"Content-Length": str(size), "Content-Type": "application/octet-stream"},
                )
            if status != 204:
                raise RuntimeError(f"raw upload: HTTP {status}: {data[:200]!r}")
        elif op == "download (client)":
            await d.client.download_to_file(d.handle, name, str(received))
        else:
            got = [0]

            def sink(chunk: bytes) -> None:
                got[0] += len(chunk)

            status, _ = d.raw.request("GET", d.path("file", path=name), sink=sink)
            if status != 200 or got[0] != size:
                raise RuntimeError(f"raw download: HTTP {status}, {got[0]} of {size} bytes")
        elapsed = time.perf_counter() - start
        if op.startswith("download (client)") and received.stat().st_size != size:
            raise RuntimeError("download: wrong size")
        return size / elapsed / MB

    def _peer_upload(self, source: Path, size: int) -> float:
        assert self.peer is not None
        boundary = uuid.uuid4().hex
        target = str(self.workdir / "peer-target.bin")
        head = (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="target_path"\r\n\r\n'
            f"{target}\r\n"
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="file"; filename="transfer.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()

        def body() -> Iterator[bytes]:
            yield head
            with open(source, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
            yield tail

        headers = {
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Content-Length": str(len(head) + size + len(tail)),
        }
        self.peer.ready()
        start = time.perf_counter()
        status, data = self.peer.request("POST", "/upload", body(), headers)
        elapsed = time.perf_counter() - start
        if status != 200:
            raise RuntimeError(f"peer upload: HTTP {status}: {data[:200]!r}")
        return size / elapsed / MB

    def _peer_download(self, size: int) -> float:
        """``POST /read_file`` (the peer's only way to read a file: text in a JSON string)."""
        assert self.peer is not None
        target = str(self.workdir / "peer-target.bin")
        got = [0]

        def sink(chunk: bytes) -> None:
            got[0] += len(chunk)

        body = json.dumps({"path": target}).encode()
        self.peer.ready()
        start = time.perf_counter()
        status, _ = self.peer.request(
            "POST", "/read_file", body, {"Content-Type": "application/json"}, sink=sink
        )
        elapsed = time.perf_counter() - start
        if status != 200 or got[0] < size:
            raise RuntimeError(f"peer download: HTTP {status}, {got[0]} bytes")
        os.unlink(target)
        return size / elapsed / MB

    # Walk

    async def walk(self) -> None:
        """``walk`` of a tree of many empty files, beside walking it in-process and with find."""
        n = self.sizes.walk_files
        f = self.floors
        assert f is not None
        find = shutil.which("find") or "/usr/bin/find"
        for label, d in self.daemons.items():
            top = d.workspace / "walk"
            owner = d.workspace.stat()
            make_tree(top, n, owner.st_uid, owner.st_gid)
            times: dict[str, list[float]] = {"python": [], "find": [], "client": [], "raw": []}
            for _ in range(self.sizes.walk_reps):
                times["python"].append(scan_tree(top, n))
                argv = [find, str(top), "-type", "f", "-printf", "%i %s %T@ %C@ %p\n"]
                times["find"].append(floor.run(argv, f.env)[0])
                await self.settle()
                start = time.perf_counter()
                entries = await d.client.walk(d.handle, "/walk")
                times["client"].append(time.perf_counter() - start)
                if len(entries) != n:
                    raise RuntimeError(f"walk: {len(entries)} of {n} entries")
                d.raw.ready()
                start = time.perf_counter()
                status, _ = d.raw.request("GET", d.path("walk", root="/walk"))
                if status != 200:
                    raise RuntimeError(f"raw walk: HTTP {status}")
                times["raw"].append(time.perf_counter() - start)
            shutil.rmtree(top)
            ref = median(times["python"])
            self.row(
                "walk (floor)",
                f"{label}: scandir+lstat in-process, {n} files",
                ref,
                "s",
                extra={"files": n},
            )
            self.row(
                "walk (floor)",
                f"{label}: find -printf, {n} files",
                median(times["find"]),
                "s",
                ref="scandir+lstat",
                ref_value=ref,
                extra={"files": n},
            )
            for how in ("client", "raw"):
                self.row(
                    "walk",
                    f"{label} ({how}), {n} files",
                    median(times[how]),
                    "s",
                    ref="scandir+lstat",
                    ref_value=ref,
                    target=at_most(1.0, " s") if n == 100_000 else None,
                    extra={"files": n},
                )

    # Concurrency

    async def concurrent(self) -> None:
        """``sleepers`` concurrent ``sleep S`` execs: wall time until the last one is done."""
        c, s = self.sizes.sleepers, self.sizes.sleep
        f = self.floors
        assert f is not None
        sleep = shutil.which("sleep") or "/bin/sleep"
        ref = floor.run_many([sleep, str(s)], f.env, c)
        self.row("concurrent sleeps (floor)", f"{c} x sleep {s:g} spawned", ref, "s")
        for label, d in self.daemons.items():
            # The client's connection pool is warmed first (as many connections as calls):
            # the figure is the daemon's, not that of TCP handshakes.
            await self._all(d, ["true"], c)
            walls = [await self._all(d, ["sleep", str(s)], c) for _ in range(self.sizes.sleep_reps)]
            self.row(
                "concurrent sleeps",
                f"{label}: {c} x sleep {s:g} (client)",
                median(walls),
                "s",
                ref="floor",
                ref_value=ref,
                target=at_most(1.5 * s, " s"),
                extra={"walls_s": walls},
            )
            walls = [raw_all(d, ["sleep", str(s)], c) for _ in range(self.sizes.sleep_reps)]
            self.row(
                "concurrent sleeps",
                f"{label}: {c} x sleep {s:g} (raw, a thread each)",
                median(walls),
                "s",
                ref="floor",
                ref_value=ref,
                target=at_most(1.5 * s, " s"),
                extra={"walls_s": walls},
            )

    async def _all(self, d: Sandboxd, argv: list[str], count: int) -> float:
        """Seconds until ``count`` concurrent execs of ``argv`` have all ended (exit 0)."""
        await self.settle()
        start = time.perf_counter()
        calls = [d.client.exec(d.handle, argv) for _ in range(count)]
        results = await DeferredList(calls, consumeErrors=True)
        wall = time.perf_counter() - start
        bad = [r for ok, r in results if not ok or r.exit_code != 0]
        if bad:
            raise RuntimeError(f"concurrent {argv}: {len(bad)} failed: {bad[0]}")
        return wall


def raw_all(d: Sandboxd, argv: list[str], count: int) -> float:
    """Seconds until ``count`` execs of ``argv`` sent at once over ``count`` connections
    (``http.client``, a thread each, connected beforehand) have all ended with exit 0."""
    clients = [RawHTTP(d.server.port).ready() for _ in range(count)]
    body = json.dumps({"cmd": argv}).encode()
    gate = threading.Barrier(count + 1)
    failures: list[str] = []

    def one(client: RawHTTP) -> None:
        gate.wait()
        try:
            status, data = client.request("POST", d.path("exec"), body)
            if status != 200 or b'"exit":0' not in data:
                failures.append(f"HTTP {status}: {data[-200:]!r}")
        except Exception as e:
            failures.append(repr(e))

    threads = [threading.Thread(target=one, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    gate.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    for client in clients:
        client.close()
    if failures:
        raise RuntimeError(f"concurrent {argv}: {len(failures)} failed: {failures[0]}")
    return wall


def make_file(path: Path, size: int) -> None:
    """``size`` bytes of printable text (the peer reads files as text)."""
    block = base64.b64encode(os.urandom(3 * MiB // 4))[:MiB]
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[:left])
            left -= min(left, len(block))


def base64_rates(codec: Any, total: int = 256 * MiB) -> tuple[float, float]:
    """MB/s (of raw bytes) of base64-encoding, and of decoding, 1 MiB chunks in-process, with
    ``codec`` (``base64``; ``pybase64``, which the daemon and the client use)."""
    chunk = os.urandom(MiB)
    count = total // len(chunk)
    start = time.perf_counter()
    for _ in range(count):
        encoded = codec.b64encode(chunk)
    middle = time.perf_counter()
    for _ in range(count):
        codec.b64decode(encoded)
    end = time.perf_counter()
    return total / (middle - start) / MB, total / (end - middle) / MB


def copy_rate(source: Path, target: Path) -> float:
    """MB/s of copying ``source`` with 1 MiB reads and writes (no copy_file_range).

    The copy is removed afterwards: its page cache freed, the transfer measured next starts from
    the machine the earlier ones had (here a new page of guest memory costs several times a
    recycled one, and 1 GiB of them is the whole difference between two runs of an upload).
    """
    size = source.stat().st_size
    buffer = bytearray(MiB)
    start = time.perf_counter()
    with open(source, "rb", buffering=0) as src, open(target, "wb", buffering=0) as dst:
        while n := src.readinto(buffer):
            dst.write(memoryview(buffer)[:n])
    elapsed = time.perf_counter() - start
    target.unlink()
    return size / elapsed / MB


def make_tree(top: Path, n: int, uid: int, gid: int) -> None:
    """``n`` empty files, 1000 to a directory, owned by ``uid``/``gid``."""
    per_dir = 1000
    top.mkdir()
    os.chown(top, uid, gid)
    for i in range(0, n, per_dir):
        sub = top / f"d{i // per_dir:04d}"
        sub.mkdir()
        os.chown(sub, uid, gid)
        for j in range(min(per_dir, n - i)):
            fd = os.open(sub / f"f{j:04d}.txt", os.O_WRONLY | os.O_CREAT, 0o644)
            os.fchown(fd, uid, gid)
            os.close(fd)


def scan_tree(top: Path, n: int) -> float:
    """Seconds to list every regular file under ``top`` with its lstat, in this process."""
    start = time.perf_counter()
    found = 0
    stack = [str(top)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    entry.stat(follow_symlinks=False)
                    found += 1
    elapsed = time.perf_counter() - start
    if found != n:
        raise RuntimeError(f"scan: {found} of {n} files")
    return elapsed
