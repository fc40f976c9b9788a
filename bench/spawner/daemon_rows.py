#!/usr/bin/env python3
"""Today's isolated daemon, end to end, beside one HTTP round trip and the spawn floor.

    sudo nice -n 19 .venv/bin/python bench/spawner/daemon_rows.py --rounds 300

One isolated daemon (``twistd -n sandboxd``, every layer at its default: cgroups, namespaces,
seccomp), one sandbox, one kept-alive raw HTTP connection (``bench/sbench/rawhttp.py``), in
interleaved rounds: ``exec true`` through the helper (``SANDBOXD_SPAWNER=helper``; request to
the exit frame), ``GET …/processes`` (a request that reaches the manager and answers JSON: the
HTTP round trip), and ``posix_spawn`` of ``/bin/true`` from this process (the spawn floor).
Prints p50/p90 of each.

``--server`` starts a second isolated daemon with ``SANDBOXD_SPAWNER=server`` (its own uid
range) and adds its ``exec true`` as the row ``exec-server``, interleaved with the others;
``--zygote`` the same with ``SANDBOXD_SPAWNER=zygote`` (row ``exec-zygote``: after the warm-up
rounds every exec is forked by the sandbox's zygote, whose quiet spell the rounds never reach).
``--processes`` adds, for each daemon, a background ``true`` (``POST …/processes``, then its
output followed to the exit frame: what E2B's ``commands.run`` costs) as ``process[-MODE]``.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
REPO = Path(__file__).resolve().parents[2]

from bench.sbench import procs, rawhttp  # noqa: E402
from bench.spawner.run import ENV, spawned, summary  # noqa: E402

TRACED = "recvfrom,pipe2,clone3,execve,exit_group,wait4,sendto"


def traced_popen(out: str) -> Callable[..., subprocess.Popen[bytes]]:
    """``subprocess.Popen`` that starts the daemon under ``strace -f --seccomp-bpf``, stopping
    only at the calls that mark an exec's segments (the others run at full speed)."""
    real = subprocess.Popen

    def popen(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        strace = ["strace", "-f", "--seccomp-bpf", "-ttt", "-e", f"trace={TRACED}", "-o", out]
        return real([*strace, *argv], **kwargs)  # type: ignore[call-overload,no-any-return]

    return popen


def profiled_popen(out: str) -> Callable[..., subprocess.Popen[bytes]]:
    """``subprocess.Popen`` that starts the daemon under twistd's own cProfile (its stats are
    saved to ``out`` when the reactor stops)."""
    real = subprocess.Popen

    def popen(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        options = [f"--profile={out}", "--profiler=cprofile", "--savestats"]
        return real([argv[0], *options, *argv[1:]], **kwargs)  # type: ignore[call-overload,no-any-return]

    return popen


def stop_traced(server: procs.Server) -> None:
    """SIGTERM the daemon itself (strace's child, by pid), so that it drains and removes its
    cgroups; strace ends with it."""
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    for pid in children:
        os.kill(int(pid), signal.SIGTERM)
    server.process.wait(60)


HELPER = REPO / "sandboxd" / "isolation" / "exec" / "sandboxd-exec"
REAL = HELPER.with_name("sandboxd-exec.real")
SHIM_LOG = Path("/tmp/spawnbench-shim.log")
SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    (void)argc;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int fd = open(LOG, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    dprintf(fd, "%ld.%09ld\n", (long)ts.tv_sec, ts.tv_nsec);
    close(fd);
    execv(REAL, argv);
    return 125;
}
"""


def install_shim() -> None:
    """Put a shim in the helper's place that notes CLOCK_MONOTONIC (``perf_counter``'s clock)
    as it starts, then execs the real helper: the daemon's side, request to the helper's first
    instruction, is then timed with no tracer. :func:`remove_shim` puts the helper back."""
    source = REAL.with_name("spawnbench-shim.c")
    source.write_text(SHIM_SOURCE)
    SHIM_LOG.unlink(missing_ok=True)
    os.rename(HELPER, REAL)
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-static",
            f'-DREAL="{REAL}"',
            f'-DLOG="{SHIM_LOG}"',
            "-o",
            str(HELPER),
            str(source),
        ],
        check=True,
    )
    source.unlink()


def remove_shim() -> None:
    if REAL.exists():
        os.replace(REAL, HELPER)
    SHIM_LOG.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--strace", metavar="FILE", help="run the daemon under strace into FILE")
    parser.add_argument("--profile", metavar="FILE", help="run the daemon under cProfile into FILE")
    parser.add_argument(
        "--shim", action="store_true", help="time the daemon's side up to the helper's start"
    )
    parser.add_argument(
        "--server", action="store_true", help="add a SANDBOXD_SPAWNER=server daemon's exec row"
    )
    parser.add_argument(
        "--zygote", action="store_true", help="add a SANDBOXD_SPAWNER=zygote daemon's exec row"
    )
    parser.add_argument(
        "--processes",
        action="store_true",
        help="add each daemon's background `true`: started, then followed to its exit",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="spawnbench-daemon-"))
    # procs.start_sandboxd starts the daemon with subprocess.Popen: the wrapped one, from here.
    if args.strace:
        subprocess.Popen = traced_popen(args.strace)  # type: ignore[assignment,misc]
    if args.profile:
        subprocess.Popen = profiled_popen(args.profile)  # type: ignore[assignment,misc]
    if args.shim:
        install_shim()
    try:
        # the helper's path, the reference row (no longer the default: SANDBOXD_SPAWNER=zygote)
        helper = {"SANDBOXD_SPAWNER": "helper"}
        server = procs.start_sandboxd("spawnbench", True, workdir, helper)
    except BaseException:
        remove_shim()
        raise
    raw = rawhttp.RawHTTP(server.port)
    others: dict[str, tuple[procs.Server, rawhttp.RawHTTP]] = {}
    uid_ranges = {"server": ("612500", "614999"), "zygote": ("615000", "617499")}
    try:
        for mode in [m for m in ("server", "zygote") if getattr(args, m)]:
            low, high = uid_ranges[mode]
            settings = {"SANDBOXD_UID_MIN": low, "SANDBOXD_UID_MAX": high}
            other = procs.start_sandboxd(
                f"spawnbench-{mode}", True, workdir, {**settings, "SANDBOXD_SPAWNER": mode}
            )
            others[mode] = (other, rawhttp.RawHTTP(other.port))
    except BaseException:
        for other, other_raw in others.values():
            other_raw.close()
            other.stop()
        server.stop()
        raise
    try:
        print("load average at start:", Path("/proc/loadavg").read_text().strip())
        status, body = raw.request("POST", "/sandboxes", b"{}")
        assert status == 200, (status, body)
        rid = json.loads(body)["remote_id"]
        exec_body = json.dumps({"cmd": ["true"]}).encode()

        split: dict[str, list[float]] = {"to-helper": [], "helper-on": []}

        def exec_true() -> float:
            start = time.perf_counter()
            status, body = raw.ready().request("POST", f"/sandboxes/{rid}/exec", exec_body)
            end = time.perf_counter()
            took = end - start
            if args.shim:
                entered = float(SHIM_LOG.read_text().split()[-1])
                split["to-helper"].append(entered - start)
                split["helper-on"].append(end - entered)
            last = json.loads(body.splitlines()[-1])
            assert status == 200 and last.get("exit") == 0, (status, body)
            return took

        def round_trip() -> float:
            start = time.perf_counter()
            status, body = raw.ready().request("GET", f"/sandboxes/{rid}/processes")
            took = time.perf_counter() - start
            assert status == 200, (status, body)
            return took

        def create(other_raw: rawhttp.RawHTTP) -> str:
            status, body = other_raw.request("POST", "/sandboxes", b"{}")
            assert status == 200, (status, body)
            return str(json.loads(body)["remote_id"])

        def exec_row(other_raw: rawhttp.RawHTTP, other_rid: str) -> Callable[[], float]:

            def exec_other() -> float:
                start = time.perf_counter()
                status, body = other_raw.ready().request(
                    "POST", f"/sandboxes/{other_rid}/exec", exec_body
                )
                took = time.perf_counter() - start
                last = json.loads(body.splitlines()[-1])
                assert status == 200 and last.get("exit") == 0, (status, body)
                return took

            return exec_other

        def process_row(raw: rawhttp.RawHTTP, rid: str) -> Callable[[], float]:
            """A background ``true`` (E2B's ``commands.run`` is one): its start, then its
            output followed to the exit frame."""
            processes = f"/sandboxes/{rid}/processes"

            def process_true() -> float:
                start = time.perf_counter()
                status, body = raw.ready().request("POST", processes, exec_body)
                assert status == 200, (status, body)
                output = f"{processes}/{json.loads(body)['id']}/output?follow=true"
                status, body = raw.ready().request("GET", output)
                took = time.perf_counter() - start
                assert status == 200 and json.loads(body.splitlines()[-1]) == {"exit": 0}, body
                return took

            return process_true

        rows: dict[str, Callable[[], float]] = {"exec": exec_true}
        if args.processes:
            rows["process"] = process_row(raw, rid)
        for mode, (_, other_raw) in others.items():
            other_rid = create(other_raw)
            rows[f"exec-{mode}"] = exec_row(other_raw, other_rid)
            if args.processes:
                rows[f"process-{mode}"] = process_row(other_raw, other_rid)
        rows |= {
            "http": round_trip,
            "floor": lambda: spawned(["/bin/true"], ENV),
        }
        times: dict[str, list[float]] = {name: [] for name in rows}
        for round_ in range(args.rounds + 10):
            for name, run in rows.items():
                took = run()
                if round_ >= 10:
                    times[name].append(took)
        if args.shim:
            times.update({k: v[-args.rounds :] for k, v in split.items()})
        for name, ts in times.items():
            print(summary(name, ts))
        exec_p50 = statistics.median(times["exec"])
        ref = statistics.median(times["http"]) + statistics.median(times["floor"])
        print(f"exec p50 / (floor p50 + http p50) = {exec_p50 / ref:.2f}")
        for mode in others:
            other_p50 = statistics.median(times[f"exec-{mode}"])
            print(f"exec-{mode} p50 / (floor p50 + http p50) = {other_p50 / ref:.2f}")
        raw.request("DELETE", f"/sandboxes/{rid}")
        print(
            "daemon pid",
            server.pid,
            "load average at end:",
            Path("/proc/loadavg").read_text().strip(),
        )
    finally:
        raw.close()
        if args.strace:
            stop_traced(server)
        server.stop()
        for other, other_raw in others.values():
            other_raw.close()
            other.stop()
        remove_shim()
    return 0


if __name__ == "__main__":
    sys.exit(main())
