"""What a template build may take of the host, for real (docs/extensions.rst, "Building a
template"): a real daemon as root with real isolation; a client that stops reading while a
``RUN`` prints (the daemon holds no more than the transport's share: the ``RUN`` waits); a
``RUN`` fork bomb, a memory hog and a ``sleep`` past the build's time, each held by the
build's cgroup or timeout, the daemon answering meanwhile and no cgroup left after.

Every attack has an outer bound that does not depend on the code under test: the ``limited``
daemon runs in a cgroup v1 ``pids`` cgroup of the test's own (``OUTER_PIDS``; the ``RUN`` runs
as the host's root, whom ``RLIMIT_NPROC`` does not hold), the hog allocates 300 MB at most, and
each build is read with a deadline. The fork bomb's outer bound is v1's (``/sys/fs/cgroup/pids``):
these tests run on the host, whose cgroups are v1; the builder itself takes either driver.
"""

import contextlib
import http.client
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.kernel_http import KernelDaemon, cgroup_dirs_named, isolation_problem
from tests.templates.rootfs import rootfs
from tests.templates.test_templates_build import context

pytestmark = [pytest.mark.kernel]

PRINTED = 200 << 20
"""What the ``RUN`` of the back-pressure test prints: far more than the daemon may hold."""
RSS_GROWTH_MAX_KIB = 64 << 10
BUILD_PIDS = 48
BUILD_TIMEOUT = 8
BUILD_CORES = 0.25
OUTER_PIDS = 600
"""The limited daemon's own cgroup's ``pids.max``: what a fork bomb out of its build's cgroup
would meet instead."""
PIDS_V1 = Path("/sys/fs/cgroup/pids")


@pytest.fixture(scope="module")
def kd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    daemon = KernelDaemon.start(tmp_path_factory.mktemp("templates-limits"), "--template-max=1G")
    try:
        answer = daemon.client.request("PUT", "/templates/busybox", rootfs("/usr/bin/tr"))
        assert answer.status == 201, answer
        yield daemon
    finally:
        daemon.stop()


def processes_with(marker: bytes) -> list[int]:
    """The processes whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
    return found


def test_a_client_that_stops_reading_makes_the_run_wait_not_the_daemon_hold(
    kd: KernelDaemon,
) -> None:
    """The client reads the first frames, then nothing for a while: the ``RUN`` (printing
    200 MiB, 16 KiB lines) waits on its pipe and the daemon's RSS stays within 64 MiB of
    what it was; once the client reads again, every byte comes, then the build's end."""
    marker = b"head -c %d /dev/zero" % PRINTED  # in the RUN's processes' command lines
    dockerfile = b"FROM busybox\nRUN echo started && %s | tr '\\0' x && echo\n" % marker
    connection = http.client.HTTPConnection("127.0.0.1", kd.daemon.port, timeout=120)
    try:
        connection.request("POST", "/templates/flood/build", context({"Dockerfile": dockerfile}))
        response = connection.getresponse()
        assert response.status == 200
        while b'"output":"started"' not in response.readline():
            pass
        deadline = time.monotonic() + 30
        while not processes_with(marker):
            assert time.monotonic() < deadline, "the RUN never started"
            time.sleep(0.01)
        before = kd.daemon.rss_kib()
        most = before
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and processes_with(marker):
            most = max(most, kd.daemon.rss_kib())
            time.sleep(0.05)
        waiting = processes_with(marker)
        most = max(most, kd.daemon.rss_kib())
        assert most - before < RSS_GROWTH_MAX_KIB, (before, most)
        assert waiting, "the RUN printed everything while its client read nothing"
        printed, end = 0, None
        for line in response:
            frame = json.loads(line)
            if "output" in frame:
                printed += len(frame["output"])
            end = frame
        assert end is not None and end["end"] == "built", end
        assert printed == PRINTED
    finally:
        connection.close()
    assert kd.call("DELETE", "/templates/flood").status == 204


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    """A daemon whose builds' commands may have 48 processes, 64 MiB and a quarter of a core,
    whose builds last 8 s at most, itself in a ``pids`` cgroup of the test's own (600
    processes)."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    if not PIDS_V1.is_dir():
        pytest.skip("the fork bomb's outer bound is a cgroup v1 pids hierarchy")
    outer = PIDS_V1 / f"sandboxd-test-build-{secrets.token_hex(4)}"
    outer.mkdir()
    try:
        (outer / "pids.max").write_text(str(OUTER_PIDS))
        enter = f'echo $$ > {outer}/cgroup.procs && exec "$@"'
        env = {
            "SANDBOXD_BUILD_PIDS_MAX": str(BUILD_PIDS),
            "SANDBOXD_BUILD_MEMORY_MAX": "64M",
            "SANDBOXD_BUILD_CPU_CORES": str(BUILD_CORES),
            "SANDBOXD_BUILD_TIMEOUT": f"{BUILD_TIMEOUT}s",
        }
        daemon = KernelDaemon.start(
            tmp_path_factory.mktemp("templates-limited"),
            "--template-max=1G",
            env=env,
            wrapper=("sh", "-c", enter, "sh"),
        )
        try:
            template = rootfs("/usr/bin/tr", "/bin/bash")
            answer = daemon.client.request("PUT", "/templates/busybox", template)
            assert answer.status == 201, answer
            yield daemon
        finally:
            daemon.stop()
    finally:
        for _ in range(100):  # a bomb that got out of its build's cgroup: killed, then removed
            for pid in (outer / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            with contextlib.suppress(OSError):
                outer.rmdir()
                break
            time.sleep(0.1)


def start(daemon: KernelDaemon, name: str, dockerfile: bytes) -> http.client.HTTPResponse:
    """A build started: its answer, whose frames are read as they come."""
    connection = http.client.HTTPConnection("127.0.0.1", daemon.daemon.port, timeout=60)
    connection.request("POST", f"/templates/{name}/build", context({"Dockerfile": dockerfile}))
    response = connection.getresponse()
    assert response.status == 200
    return response


def frames_to_the_end(response: http.client.HTTPResponse, within: float = 60) -> list[Any]:
    """The build's frames to its end, which must come ``within`` seconds (a build that goes
    on sends a keepalive frame every few seconds: the deadline is checked at each)."""
    deadline = time.monotonic() + within
    frames = []
    for line in response:
        frames.append(json.loads(line))
        assert time.monotonic() < deadline, f"the build still runs: {frames[-3:]}"
    response.close()
    return frames


def cgroup_of(marker: bytes, within: float = 30) -> tuple[int, str] | None:
    """A process of the running build's command (found by ``marker``) and the cgroup it is in:
    a child of the daemon's instance cgroup in the memory hierarchy, named like a sandbox
    (``None`` when none is found ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        for pid in processes_with(marker):
            with contextlib.suppress(OSError):
                seen = Path(f"/proc/{pid}/cgroup").read_text()
                found = re.search(r":memory:.*/sandboxd-[0-9a-f]{12}/([0-9a-f]{16})$", seen, re.M)
                if found:  # (the runner's first moments are before it joins)
                    return pid, found.group(1)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def build_cgroup(marker: bytes) -> tuple[int, str]:
    """:func:`cgroup_of`, which must be found."""
    found = cgroup_of(marker)
    assert found is not None, "no command of the build in a cgroup of its own"
    return found


def test_a_fork_bomb_is_held_at_the_builds_pids_limit(limited: KernelDaemon) -> None:
    """Every process of ``b(){ while :; do b & done; }; b`` (bash, which retries a refused
    fork) forks as fast as it can: never more than the build's ``pids.max`` of them at once,
    the kernel refusing the others, the daemon answering meanwhile; the build's time ends it
    (it never ends by itself), and nothing of it is left."""
    marker = b"bomb-3217"
    bomb = b"FROM busybox\nRUN bash -c 'echo %s; b(){ while :; do b & done; }; b'\n" % marker
    began = time.monotonic()
    response = start(limited, "bomb", bomb)
    found, events = None, []
    refused, peak = 0, 0
    while time.monotonic() < began + BUILD_TIMEOUT - 2:
        peak = max(peak, len(processes_with(marker)))
        if found is None and (found := cgroup_of(marker, within=0)) is not None:
            events = [Path(d, "pids.events") for d in cgroup_dirs_named(found[1]) if "/pids/" in d]
        with contextlib.suppress(OSError, IndexError):
            refused = int(events[0].read_text().split()[1])
        started = time.monotonic()
        assert limited.healthy()
        assert time.monotonic() - started < 5
    frames = frames_to_the_end(response)
    print(f"fork bomb at the build's pids.max {BUILD_PIDS}: peak {peak}, {refused} refused")
    assert peak <= BUILD_PIDS, f"{peak} processes of the bomb at once"
    assert found is not None and refused > 0
    group = found[1]
    end = frames[-1]
    assert end["end"] == "failed" and "SANDBOXD_BUILD_TIMEOUT" in end["error"], end
    assert not processes_with(marker)
    assert cgroup_dirs_named(group) == []
    assert limited.healthy()


def test_a_memory_hog_is_oom_killed_and_its_step_says_so(limited: KernelDaemon) -> None:
    """A ``RUN`` that holds 300 MB (its build's limit: 64 MiB) is killed by the kernel; the
    build fails at that step, naming the memory limit, and leaves nothing. ``dd`` reads into
    one buffer of 300 MB: the limit is reached after 64 MiB of page faults, a small part of
    the build's time at a quarter of a core on a loaded machine (``head | tail -c``, which
    copies every byte through a pipe, ran out of that time once under software emulation)."""
    marker = b"hog-5821"
    hog = b"echo %s; busybox dd if=/dev/zero of=/dev/null bs=300000000 count=1 && echo survived"
    response = start(limited, "hog", b"FROM busybox\nRUN %s\n" % (hog % marker))
    found = cgroup_of(marker, within=5)
    frames = frames_to_the_end(response)
    end = frames[-1]
    assert end["end"] == "failed", end
    assert found is not None
    group = found[1]
    assert (end["step"], end["exit_code"]) == (2, 137), end
    assert "out of memory" in end["error"] and "SANDBOXD_BUILD_MEMORY_MAX" in end["error"], end
    assert not any("survived" in f.get("output", "") for f in frames)
    assert cgroup_dirs_named(group) == []
    assert limited.call("GET", "/templates/hog").status == 404


def test_a_busy_loop_gets_the_builds_cpu_share(limited: KernelDaemon) -> None:
    """A ``RUN`` spinning for ever uses a quarter of a core at most (its cgroup's CPU time,
    over two seconds), until the build's time ends it."""
    marker = b"cpu-hog-4410"
    response = start(limited, "spin", b"FROM busybox\nRUN echo %s; while :; do :; done\n" % marker)
    _, group = build_cgroup(marker)
    (usage,) = [Path(d, "cpuacct.usage") for d in cgroup_dirs_named(group) if "/cpuacct/" in d]
    time.sleep(0.5)  # the loop under way
    before, began = int(usage.read_text()), time.monotonic()
    time.sleep(2)
    used = (int(usage.read_text()) - before) / 1e9 / (time.monotonic() - began)
    frames = frames_to_the_end(response)
    print(f"a busy loop at SANDBOXD_BUILD_CPU_CORES={BUILD_CORES}: {used:.3f} of a core")
    assert 0.05 < used <= BUILD_CORES * 1.2, used
    assert "SANDBOXD_BUILD_TIMEOUT" in frames[-1]["error"], frames[-1]
    assert cgroup_dirs_named(group) == []


def test_a_build_past_its_time_is_killed_and_fails_saying_so(limited: KernelDaemon) -> None:
    """A ``RUN`` of ``sleep 1000`` in a build that may last 8 s: killed then, the build failed
    at that step naming ``SANDBOXD_BUILD_TIMEOUT``, no process nor cgroup left."""
    marker = b"1000.25"
    began = time.monotonic()
    response = start(limited, "slow", b"FROM busybox\nRUN echo waiting; sleep %s\n" % marker)
    pid, group = build_cgroup(marker)
    frames = frames_to_the_end(response)
    took = time.monotonic() - began
    end = frames[-1]
    assert end["end"] == "failed" and end["step"] == 2, end
    assert "SANDBOXD_BUILD_TIMEOUT" in end["error"] and end["exit_code"] == 137, end
    assert end["output"] == ["waiting"]
    assert BUILD_TIMEOUT <= took < BUILD_TIMEOUT + 20, took
    assert not Path(f"/proc/{pid}").exists()
    assert cgroup_dirs_named(group) == []
    assert limited.call("GET", "/templates/slow").status == 404


def test_a_builds_cgroup_a_killed_daemon_left_is_removed_at_its_restart(tmp_path: Path) -> None:
    """The daemon is killed (SIGKILL) while a ``RUN`` runs: its processes die with it, its
    cgroup stays (nothing removed it); the next start on the same root kills and removes it."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    marker = b"1000.75"
    first = KernelDaemon.start(tmp_path, "--template-max=1G")
    try:
        answer = first.client.request("PUT", "/templates/busybox", rootfs())
        assert answer.status == 201, answer
        response = start(first, "cut", b"FROM busybox\nRUN sleep %s\n" % marker)
        _, group = build_cgroup(marker)
    finally:
        first.daemon.process.kill()  # not stop(): that would drain and remove the state root
        first.daemon.process.wait(30)
    response.close()
    deadline = time.monotonic() + 10
    while processes_with(marker):
        assert time.monotonic() < deadline, "the RUN outlived its daemon"
        time.sleep(0.01)
    assert cgroup_dirs_named(group) != []
    second = KernelDaemon.start(tmp_path, "--template-max=1G")
    try:
        assert cgroup_dirs_named(group) == []  # recovery ran before the daemon answered
        assert [t["name"] for t in second.call("GET", "/templates").json()["templates"]] == [
            "busybox"
        ]
    finally:
        second.stop()


def test_a_daemon_stopped_mid_build_ends_it_and_leaves_no_cgroup(tmp_path: Path) -> None:
    """SIGTERM while a ``RUN`` runs: the daemon cancels the build before its reactor stops
    (its command killed, its cgroup and directory removed), and stops with nothing left
    (``KernelDaemon.stop`` checks no cgroup of its instance remains)."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    marker = b"1000.5"
    daemon = KernelDaemon.start(tmp_path, "--template-max=1G")
    try:
        answer = daemon.client.request("PUT", "/templates/busybox", rootfs())
        assert answer.status == 201, answer
        response = start(daemon, "cut", b"FROM busybox\nRUN sleep %s\n" % marker)
        _, group = build_cgroup(marker)
    finally:
        began = time.monotonic()
        daemon.stop()
    print(f"stopped in {time.monotonic() - began:.2f} s")
    response.close()
    assert cgroup_dirs_named(group) == []
    assert not processes_with(marker)
