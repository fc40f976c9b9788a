"""A sandbox's mount namespace is a copy of the namespace server's template, not of the host's.

The host's mount namespace holds three pins per live sandbox (``{root}/.ns/RID/{ipc,mnt,net}``,
nsfs bind mounts); the template, made once when the server starts, holds none. So what a new
sandbox's mount table lists, read by a command inside it, names no other sandbox's pin and does
not grow with the number of sandboxes alive (a copy of the host's would list them all, and cost
more at each create the more there are). As root, with a real daemon.
"""

import os
from collections import Counter
from pathlib import Path

import pytest

from sandboxd.isolation.namespaces.mounts import re_octal
from tests.kernel.kernel_http import Box, KernelDaemon, isolation_problem

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

ALIVE = 5
"""Sandboxes alive besides the first one and the one looked into."""


def mount_points(text: str) -> list[str]:
    """The mount point of each line of ``/proc/PID/mountinfo`` text."""
    return [re_octal(line.split(" ")[4]) for line in text.splitlines()]


def seen_from(box: Box) -> list[str]:
    """The mount points listed by ``/proc/self/mountinfo`` in the sandbox."""
    return mount_points(box.ok("cat /proc/self/mountinfo"))


def test_a_new_sandboxs_mount_table_names_no_pin_and_does_not_grow(tmp_path: Path) -> None:
    kd = KernelDaemon.start(tmp_path, uids=ALIVE + 2)
    try:
        pins = os.path.realpath(kd.root / ".ns") + "/"
        first = kd.create()
        alone = seen_from(first)
        boxes = [first, *(kd.create() for _ in range(ALIVE))]
        on_host = mount_points(Path("/proc/self/mountinfo").read_text())
        for box in boxes:  # the pins are there to be copied, on the host's side
            assert f"{pins}{box.rid}/mnt" in on_host, box.rid
        last = kd.create()
        seen = seen_from(last)
        assert [point for point in seen if point.startswith(pins)] == []
        # Nothing beyond what the first saw (another daemon's mounts on this host may have gone
        # meanwhile: a mount point removed on the host goes from every namespace).
        assert Counter(seen) - Counter(alone) == Counter()
    finally:
        kd.stop()
