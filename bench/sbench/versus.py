"""Docker beside sandboxd (issue 20), in the same run: each row of sandboxd's with Docker's figure
as its reference and the issue's target.

- Latency, in interleaved rounds (each round: every sandboxd daemon, then Docker, a few whole
  lives each): create (sandboxd ``POST /sandboxes``; Docker create + start of a container running
  ``sleep infinity``, as ``containers.run(detach=True)``), exec ``true`` and exec ``python3 -c
  pass`` (Docker: exec create, start attached, inspect for the exit code, as ``exec_run``), and
  kill (sandboxd ``DELETE``; Docker ``DELETE ?force=1``, as ``remove(force=True)``). p50 is the
  figure, p99 beside it. sandboxd is driven by the same thin ``http.client`` client (raw).
- Memory per idle sandbox / container: the proportional set size (PSS) of the whole process
  tree (sandboxd: the daemon and its helpers; Docker: dockerd, containerd, the shims and each
  container's ``sleep``) and the host's ``MemAvailable``, before and after N idle ones, over N.
- Throughput: execs of ``true`` per second, one thread and connection per sandbox / container,
  all at once, across ``docker_parallel`` of them (32 in a full run).
"""

import threading
import time
from collections.abc import Callable
from typing import Any

from .dockerd import Dockerd, Engine, descendants, mem_available_kib, pss_kib
from .rawhttp import RawHTTP
from .stats import pct

OPS = ("create", "exec true", "exec python3 -c pass", "kill")
EXECS = {"exec true": ["true"], "exec python3 -c pass": ["python3", "-c", "pass"]}
DOCKER = "docker"


class SandboxdSide:
    """One sandboxd daemon through ``RawHTTP``, with the calls the rows time."""

    def __init__(self, port: int, pid: int) -> None:
        self.port = port
        self.pid = pid
        self.raw = RawHTTP(port)

    def create(self, raw: RawHTTP | None = None) -> str:
        return str((raw or self.raw).json("POST", "/sandboxes", {})["remote_id"])

    def exec(self, rid: str, cmd: list[str], raw: RawHTTP | None = None) -> None:
        status, data = (raw or self.raw).request("POST", f"/sandboxes/{rid}/exec", _body(cmd))
        if status != 200 or b'"exit":0' not in data:
            raise RuntimeError(f"sandboxd exec {cmd}: HTTP {status}: {data[-200:]!r}")

    def kill(self, rid: str) -> None:
        self.raw.json("DELETE", f"/sandboxes/{rid}")

    def pids(self) -> list[int]:
        return descendants({self.pid})

    def client(self) -> RawHTTP:
        return RawHTTP(self.port).ready()


class DockerSide:
    """The bench's dockerd through :class:`Engine`."""

    def __init__(self, daemon: Dockerd) -> None:
        self.daemon = daemon
        self.engine = daemon.engine()

    def create(self, engine: Engine | None = None) -> str:
        return (engine or self.engine).run(["sleep", "infinity"])

    def exec(self, cid: str, cmd: list[str], engine: Engine | None = None) -> None:
        code, output = (engine or self.engine).exec_run(cid, cmd)
        if code != 0:
            raise RuntimeError(f"docker exec {cmd}: exit {code}: {output[-200:]!r}")

    def kill(self, cid: str) -> None:
        self.engine.remove(cid)

    def pids(self) -> list[int]:
        return self.daemon.pids()

    def client(self) -> Engine:
        return self.daemon.engine()


Side = SandboxdSide | DockerSide


def _body(cmd: list[str]) -> bytes:
    import json

    return json.dumps({"cmd": cmd}).encode()


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def lives(sides: dict[str, Side], rounds: int, per_round: int) -> dict[str, dict[str, list[float]]]:
    """Samples (s) of each op, per side: ``rounds`` rounds of ``per_round`` lives per side."""
    samples: dict[str, dict[str, list[float]]] = {name: {op: [] for op in OPS} for name in sides}
    for side in sides.values():  # warm-up: one life each, untimed
        one_life(side, {op: [] for op in OPS})
    for _ in range(rounds):
        for name, side in sides.items():
            for _ in range(per_round):
                one_life(side, samples[name])
    return samples


def one_life(side: Side, into: dict[str, list[float]]) -> None:
    if isinstance(side, SandboxdSide):
        side.raw.ready()
    seconds, handle = timed(side.create)
    into["create"].append(seconds)
    for op, cmd in EXECS.items():
        for _ in range(2):
            if isinstance(side, SandboxdSide):
                side.raw.ready()
            start = time.perf_counter()
            side.exec(handle, cmd)
            into[op].append(time.perf_counter() - start)
    if isinstance(side, SandboxdSide):
        side.raw.ready()
    into["kill"].append(timed(lambda: side.kill(handle))[0])


def idle_memory(side: Side, count: int, settle: float = 1.0) -> dict[str, float]:
    """PSS of the side's processes and the host's MemAvailable, per idle sandbox/container."""
    time.sleep(settle)
    pss_before, avail_before = pss_kib(side.pids()), mem_available_kib()
    handles: list[str] = []
    try:
        for _ in range(count):
            handles.append(side.create())
        time.sleep(settle)
        pss_after, avail_after = pss_kib(side.pids()), mem_available_kib()
    finally:
        for handle in handles:
            side.kill(handle)
    return {
        "pss_kib": (pss_after - pss_before) / count,
        "mem_available_kib": (avail_before - avail_after) / count,
        "pss_before_kib": pss_before,
        "pss_after_kib": pss_after,
    }


def throughput(side: Side, handles: list[str], execs: int) -> float:
    """Execs of ``true`` per second, a thread and a connection per handle, all started at once."""
    clients = [side.client() for _ in handles]
    gate = threading.Barrier(len(handles) + 1)
    failures: list[str] = []

    def work(handle: str, client: Any) -> None:
        gate.wait()
        try:
            for _ in range(execs):
                side.exec(handle, ["true"], client)
        except Exception as e:
            failures.append(repr(e))

    threads = [
        threading.Thread(target=work, args=pair) for pair in zip(handles, clients, strict=True)
    ]
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
        raise RuntimeError(f"throughput: {len(failures)} threads failed: {failures[0]}")
    return len(handles) * execs / wall


def ms_stats(samples: list[float]) -> dict[str, Any]:
    return {
        "p50": pct(samples, 0.5) * 1e3,
        "p99_ms": pct(samples, 0.99) * 1e3,
        "min_ms": min(samples) * 1e3,
        "n": len(samples),
        "samples_ms": [round(x * 1e3, 3) for x in samples],
    }


DOCKER_REF = "Docker"


def section(bench: Any) -> None:
    """Every Docker row and the sandboxd rows beside it (``bench``: a ``figures.Bench``)."""
    daemon: Dockerd | None = bench.dockerd
    if daemon is None:
        return
    s = bench.sizes
    sides: dict[str, Side] = {
        label: SandboxdSide(d.server.port, d.server.pid) for label, d in bench.daemons.items()
    }
    sides[DOCKER] = DockerSide(daemon)
    try:
        samples = lives(sides, s.docker_rounds, s.docker_per_round)
        settle = 0.2 if s.quick else 1.0
        memory = {name: idle_memory(side, s.docker_idle, settle) for name, side in sides.items()}
        rates = concurrent_rates(sides, s)
    finally:
        for side in sides.values():
            (side.raw if isinstance(side, SandboxdSide) else side.engine).close()
    add_rows(bench, f"docker {daemon.version} (Engine API, raw)", samples, memory, rates)


def add_rows(
    bench: Any,
    peer: str,
    samples: dict[str, dict[str, list[float]]],
    memory: dict[str, dict[str, float]],
    rates: dict[str, list[float]],
) -> None:
    """The rows of what :func:`section` measured: Docker's first, then each daemon's beside it
    (Docker's figure as the reference, the issue's target where it sets one)."""
    from .figures import Target, at_most

    s = bench.sizes
    labels = [name for name in samples if name != DOCKER]
    for op in OPS:
        ref = ms_stats(samples[DOCKER][op])
        bench.row(op, peer, ref["p50"], "ms", extra=ref)
        for label in labels:
            mine = ms_stats(samples[label][op])
            target = None
            if label == "isolated" and op == "create":
                target = at_most(2, " ms")
            elif label == "isolated" and op == "exec true":
                target = Target("≤ 2 ms and ≥ 25x faster than Docker", within(2, ref["p50"] / 25))
            bench.row(
                op,
                f"{label} (raw)",
                mine["p50"],
                "ms",
                ref=DOCKER_REF,
                ref_value=ref["p50"],
                target=target,
                extra=mine,
            )
    n = s.docker_idle
    for figure, key, what in (
        ("memory per idle one", "pss_kib", f"PSS of its process tree / {n}"),
        ("host memory per idle one", "mem_available_kib", f"MemAvailable drop / {n}"),
    ):
        ref_kib = memory[DOCKER][key]
        bench.row(figure, f"docker: {what}", ref_kib, "KiB", extra=memory[DOCKER])
        for label in labels:
            bench.row(
                figure,
                f"{label}: {what}",
                memory[label][key],
                "KiB",
                ref=DOCKER_REF,
                ref_value=ref_kib,
                target=at_most(20, " KiB") if key == "pss_kib" else None,
                extra=memory[label],
            )
    n = s.docker_parallel
    docker_rate = _median(rates[DOCKER])
    extra = {"rates": rates[DOCKER], "execs_each": s.docker_execs}
    bench.row(f"execs/s, {n} at once", f"docker: {n} containers", docker_rate, "/s", extra=extra)
    for label in labels:
        bench.row(
            f"execs/s, {n} at once",
            f"{label}: {n} sandboxes",
            _median(rates[label]),
            "/s",
            ref=DOCKER_REF,
            ref_value=docker_rate,
            extra={"rates": rates[label], "execs_each": s.sandboxd_execs},
        )


def concurrent_rates(sides: dict[str, Side], s: Any) -> dict[str, list[float]]:
    """Interleaved repetitions of :func:`throughput` on every side (handles made once)."""
    handles = {
        name: [side.create() for _ in range(s.docker_parallel)] for name, side in sides.items()
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for name, side in sides.items():  # warm-up: every connection's first exec
            throughput(side, handles[name], 1)
        for _ in range(s.docker_throughput_reps):
            for name, side in sides.items():
                execs = s.docker_execs if name == DOCKER else s.sandboxd_execs
                rates[name].append(throughput(side, handles[name], execs))
    finally:
        for name, side in sides.items():
            for handle in handles[name]:
                side.kill(handle)
    return rates


def within(*limits: float) -> Callable[[float], bool]:
    """A check that a value is at most every one of ``limits``."""
    return lambda value: all(value <= limit for limit in limits)


def _median(values: list[float]) -> float:
    return pct(values, 0.5)
