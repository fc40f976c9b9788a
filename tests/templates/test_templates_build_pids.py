"""A ``RUN``'s process limit holds under either cgroup driver (docs/extensions.rst, "Building
a template"): a real daemon as root with real isolation, ``SANDBOXD_BUILD_PIDS_MAX`` small.
The same test runs on the host (cgroup v1) and in the VM (cgroup v2): it reads which cgroup
the ``RUN`` is in from its own ``/proc/self/cgroup`` and needs no outer bound of a cgroup
version's (its loop of forks is bounded).
"""

import io
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.kernel_http import KernelDaemon, isolation_problem
from tests.templates.rootfs import rootfs

pytestmark = [pytest.mark.kernel]

PIDS_MAX = 8
FORKS = 24
"""The ``RUN``'s loop: more background processes than its cgroup may hold."""
BUILD_CGROUP = re.compile(
    r"^\d+:(?:[^:\n]*\bpids\b[^:\n]*)?:.*/sandboxd-[0-9a-f]{12}/[0-9a-f]{16}$", re.M
)
"""A line of ``/proc/self/cgroup`` in a build's cgroup: below the daemon's instance cgroup,
named like a sandbox (v1: the pids hierarchy's line; v2: the ``0::`` line)."""


@pytest.fixture(scope="module")
def kd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    env = {"SANDBOXD_BUILD_PIDS_MAX": str(PIDS_MAX)}
    daemon = KernelDaemon.start(tmp_path_factory.mktemp("templates-pids"), env=env)
    try:
        assert daemon.client.request("PUT", "/templates/busybox", rootfs()).status == 201
        yield daemon
    finally:
        daemon.stop()


def build(kd: KernelDaemon, name: str, dockerfile: str) -> list[dict[str, Any]]:
    """The build's frames, to its end."""
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w") as archive:
        member = tarfile.TarInfo("Dockerfile")
        member.size = len(dockerfile.encode())
        archive.addfile(member, io.BytesIO(dockerfile.encode()))
    answer = kd.client.request("POST", f"/templates/{name}/build", body.getvalue(), 120)
    assert answer.status == 200, answer
    return [json.loads(line) for line in answer.body.decode().splitlines()]


def test_a_runs_forks_past_its_pids_limit_are_refused(kd: KernelDaemon) -> None:
    """The ``RUN`` (busybox ``sh``, which stops at its first refused fork) starts background
    ``sleep``\\ s one by one, saying how many it started: fewer than ``PIDS_MAX`` (the
    runner's two processes and the shell count too), then its fork is refused and the build
    fails at that step; it was in a build's cgroup. Without the limit, all 24 start and the
    build is made."""
    loop = f"i=0; while test $i -lt {FORKS}; do sleep 1000.375 & i=$((i+1)); echo $i; done"
    run = f"cat /proc/self/cgroup; {loop}; echo all started"
    frames = build(kd, "forks", f"FROM busybox\nRUN {run}\n")
    end = frames[-1]
    output = [str(line) for line in end.get("output", [])]
    assert end["end"] == "failed" and end["step"] == 2, end
    assert BUILD_CGROUP.search("\n".join(output)), output
    started = max(int(line) for line in output if line.isdigit())
    print(f"SANDBOXD_BUILD_PIDS_MAX={PIDS_MAX}: {started} sleeps started, then: {output[-1]}")
    assert 0 < started < PIDS_MAX and "all started" not in output, output
    assert "can't fork" in output[-1], output
    assert not Path(kd.root / ".templates" / "forks").exists()
