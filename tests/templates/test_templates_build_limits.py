"""What a template build may take of the host, for real (docs/extensions.rst, "Building a
template"): a real daemon as root with real isolation, a client that stops reading while a
``RUN`` prints (the daemon holds no more than the transport's share: the ``RUN`` waits)."""

import contextlib
import http.client
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.kernel_http import KernelDaemon, isolation_problem
from tests.templates.rootfs import rootfs
from tests.templates.test_templates_build import context

pytestmark = [pytest.mark.kernel]

PRINTED = 200 << 20
"""What the ``RUN`` of the back-pressure test prints: far more than the daemon may hold."""
RSS_GROWTH_MAX_KIB = 64 << 10


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
