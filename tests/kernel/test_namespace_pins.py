"""Pinning works wherever the daemon runs: its own mount namespace, any CPU.

Linux 6.18 numbers namespaces in per-CPU batches, and pins (bind-mounts) a mount namespace only
for a pinner whose own mount namespace is numbered lower. A daemon started in a mount namespace of
its own (a pod's, a systemd unit's, ``unshare --mount``) that the CPU with the higher batch made,
and that makes its sandboxes' namespaces on the other CPU, could pin none of them (``pin …/mnt:
Invalid argument``). These tests make exactly that case on purpose, and the unpinned one, and
create hundreds of sandboxes in a row: every create must succeed.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.kernel_http import KernelDaemon, isolation_problem
from tests.kernel.ns_numbers import cpus_by_number
from tests.kernel.pod_stage import creates_in_a_row
from tests.support.daemon import REPO

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(isolation_problem() is not None, reason=str(isolation_problem())),
]

CREATES = 500


def own_mount_namespace(made_on: int | None, runs_on: int | None) -> tuple[str, ...]:
    """The wrapper starting the daemon in a new mount namespace made on CPU ``made_on``, the
    daemon then running on ``runs_on`` (``None``: wherever the scheduler puts it)."""
    made = ("taskset", "-c", str(made_on)) if made_on is not None else ()
    runs = ("taskset", "-c", str(runs_on)) if runs_on is not None else ()
    return (*made, "unshare", "--mount", "--propagation", "private", *runs)


@pytest.fixture
def cpus() -> list[int]:
    order = cpus_by_number()
    if order is None:
        pytest.skip("this kernel numbers mount namespaces in one global sequence")
    if len(order) < 2:
        pytest.skip("one CPU: every namespace comes from the same batch")
    return order


def started(tmp_path: Path, wrapper: tuple[str, ...]) -> Iterator[KernelDaemon]:
    kd = KernelDaemon.start(tmp_path, "--network=none", wrapper=wrapper)
    try:
        yield kd
    finally:
        kd.stop()


def test_a_daemon_whose_namespace_has_the_higher_number_pins_every_sandbox(
    tmp_path: Path, cpus: list[int]
) -> None:
    high, low = cpus[0], cpus[-1]
    for kd in started(tmp_path, own_mount_namespace(made_on=high, runs_on=low)):
        assert creates_in_a_row(kd, CREATES) == []


def test_a_daemon_in_its_own_mount_namespace_on_every_cpu_pins_every_sandbox(
    tmp_path: Path, cpus: list[int]
) -> None:
    for kd in started(tmp_path, own_mount_namespace(made_on=cpus[0], runs_on=None)):
        assert creates_in_a_row(kd, CREATES) == []


def test_a_daemon_in_a_pod_like_set_of_namespaces_pins_every_sandbox(
    tmp_path: Path, cpus: list[int]
) -> None:
    """Its own mount, PID and network namespaces (as a Kubernetes pod's), the mount one made by
    the CPU with the higher batch: the daemon serves on the pod's own loopback."""
    stage = [
        *("taskset", "-c", str(cpus[0])),
        *("unshare", "--mount", "--pid", "--net", "--fork", "--mount-proc"),
        *("--propagation", "private"),
        *(sys.executable, "-m", "tests.kernel.pod_stage", str(tmp_path), str(CREATES)),
    ]
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        ["timeout", "-s", "KILL", "600", *stage],
        capture_output=True,
        env=environ,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    result = json.loads(done.stdout.decode().splitlines()[-1])
    assert result["failed"] == []
