"""``FROM debian:<suite>``'s ``mmdebstrap`` held like a ``RUN`` (docs/extensions.rst,
"Building a template"): the real ``mmdebstrap`` of the host, started by a real daemon with
real isolation, runs in the build's cgroup with everything it starts, and the build's time
limit kills all of it, not only ``mmdebstrap`` itself.

Nothing is downloaded: the mirror (``SANDBOXD_DEBIAN_MIRROR``) is a 127.0.0.1 port that
accepts and never answers, on which ``apt`` waits (its own timeout is two minutes). The
cgroup is found from ``/proc/PID/cgroup`` in either cgroup version.
"""

import contextlib
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.kernel_http import (
    IN_VM,
    SLOW,
    KernelDaemon,
    cgroup_dirs_named,
    isolation_problem,
)
from tests.templates.test_templates_build_limits import frames_to_the_end, processes_with, start

pytestmark = [pytest.mark.kernel]

BUILD_TIMEOUT = 90.0 if IN_VM else 6.0
"""The build's time: ``mmdebstrap`` reaches ``apt`` in about a second here, in up to half a
minute in the VM's emulation (TCG)."""
BUILD_CGROUP = re.compile(
    r"^\d+:(?:[^:\n]*\bmemory\b[^:\n]*)?:.*/sandboxd-[0-9a-f]{12}/([0-9a-f]{16})$", re.M
)
"""A line of ``/proc/PID/cgroup`` that puts the process in a build's cgroup: below the
daemon's instance cgroup, named like a sandbox (v1: the memory hierarchy's; v2: ``0::``)."""


@pytest.fixture
def silent_mirror() -> Iterator[tuple[str, list[socket.socket]]]:
    """A mirror's URL whose port accepts connections and never answers, and the connections
    it accepted."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener shut down
            while True:
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/debian", accepted
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(10)
        for connection in accepted:
            connection.close()


def build_cgroup_of(pid: int) -> str | None:
    """The build cgroup ``pid`` is in (``None``: none, or it is gone)."""
    try:
        found = BUILD_CGROUP.search(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""  # it ended meanwhile


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it waits for the host's init to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_mmdebstrap_runs_in_the_builds_cgroup_and_the_timeout_kills_all_it_started(
    tmp_path: Path, silent_mirror: tuple[str, list[socket.socket]]
) -> None:
    """``mmdebstrap`` (found by the mirror on its command line) and what it started (``apt``,
    whose HTTP method waits on the silent mirror) are in one build cgroup; at the build's
    time limit every one of them is gone, the cgroup too, and the build fails naming
    ``SANDBOXD_BUILD_TIMEOUT``, with no partial tarball left in the cache."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap (Debian's package) is not installed")
    mirror, accepted = silent_mirror
    cache = tmp_path / "cache"
    env = {
        "SANDBOXD_DEBIAN_MIRROR": mirror,
        "SANDBOXD_DEBIAN_CACHE": str(cache),
        "SANDBOXD_BUILD_TIMEOUT": f"{BUILD_TIMEOUT:g}s",
    }
    (tmp_path / "daemon").mkdir()
    daemon = KernelDaemon.start(tmp_path / "daemon", "--template-max=1G", env=env)
    try:
        began = time.monotonic()
        response = start(daemon, "bookworm", b"FROM debian:bookworm\n")
        while not accepted:  # apt reached the mirror, and waits on it
            if time.monotonic() > began + BUILD_TIMEOUT - 1:
                frames = frames_to_the_end(response, within=BUILD_TIMEOUT + 20 * SLOW)
                pytest.fail(f"apt never reached the mirror: {frames[-5:]}")
            time.sleep(0.02)
        mmdebstrap = processes_with(mirror.encode() + b"\0")  # it and its forks
        groups = {build_cgroup_of(pid) for pid in mmdebstrap}
        assert mmdebstrap and None not in groups, "mmdebstrap is not in a build's cgroup"
        (group,) = groups
        assert group is not None
        members = [
            int(pid)
            for directory in cgroup_dirs_named(group)
            for pid in Path(directory, "cgroup.procs").read_text().split()
        ]
        names = {command_name(pid) for pid in members}
        print(f"in the build's cgroup {group}: {sorted(names)}")
        assert "mmdebstrap" in names and len(set(members)) >= 3, names  # and apt's
        frames = frames_to_the_end(response, within=BUILD_TIMEOUT + 20 * SLOW)
        took = time.monotonic() - began
        end = frames[-1]
        assert end["end"] == "failed" and "SANDBOXD_BUILD_TIMEOUT" in end["error"], end
        assert took < BUILD_TIMEOUT + 10 * SLOW, took
        assert [pid for pid in set(members) if alive(pid)] == []
        assert cgroup_dirs_named(group) == []
        assert list(cache.iterdir()) == []
        assert daemon.call("GET", "/templates/bookworm").status == 404
    finally:
        daemon.stop()
