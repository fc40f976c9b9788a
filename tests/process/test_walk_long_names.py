"""A walk of a deep tree of long names, made by the sandbox itself, against a real daemon
(issue 29: "a walk ... of a deep tree of long names answers a body thousands of times the
tree's size"): every entry repeats its whole path, so a few MB of tree would answer ~100 MB.
The walk is answered ``413 TooLarge`` naming ``SANDBOXD_WALK_BYTES_MAX`` before any byte of
it is sent, the daemon's peak RSS grows by a few MiB only, and a narrower root still answers
(docs/contract.rst, "Limits").
"""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, start_daemon, stop_daemon

MIB = 1024
"""KiB in a MiB (RSS is read in KiB)."""

LEVELS = 800
"""Levels of the tree: each a directory of a 250-character name, holding one file (and, at
level :data:`WIDE_LEVEL`, :data:`WIDE_FILES` more): ~6 MB of directories, a ~100 MB walk."""

WIDE_LEVEL, WIDE_FILES = 60, 1500

DEEP_TREE = (
    "import os\n"
    "name = 'n' * 250\n"
    f"for level in range({LEVELS}):\n"
    "    open('f' * 200, 'w').close()\n"
    f"    if level == {WIDE_LEVEL}:\n"
    f"        for i in range({WIDE_FILES}):\n"
    "            open(f'w{i}', 'w').close()\n"
    "    os.mkdir(name)\n"
    "    os.chdir(name)\n"
)
"""Made by the sandbox's own command, in its workspace (``chdir`` a level at a time: the
paths pass ``PATH_MAX``, no call names one whole)."""

RSS_BOUND = 24 * MIB
"""What the daemon's peak RSS may grow by during the walk."""


@pytest.fixture(params=["isolation-none", "isolation-real"])
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """With and without the real isolation (the sandbox's uid makes the tree; the walk
    runs as it)."""
    if request.param == "isolation-real" and os.geteuid() != 0:
        pytest.skip("the real isolation needs root")
    running = start_daemon(
        tmp_path, *(["--isolation=none"] if request.param == "isolation-none" else [])
    )
    try:
        yield running
    finally:
        stop_daemon(running)


def make_deep_tree(daemon: Daemon, rid: str) -> None:
    status, body = daemon.call(
        "POST", f"/sandboxes/{rid}/exec", {"cmd": ["python3", "-c", DEEP_TREE]}
    )
    assert status == 200
    assert json.loads(body.splitlines()[-1])["exit"] == 0, body[-500:]


def test_a_walk_of_a_deep_tree_of_long_names_is_refused_before_it_is_sent(
    daemon: Daemon,
) -> None:
    rid = daemon.create()
    make_deep_tree(daemon, rid)
    before = daemon.rss_kib("VmHWM")
    status, body = daemon.call("GET", f"/sandboxes/{rid}/walk?root=/")
    grown = daemon.rss_kib("VmHWM") - before
    print(f"\ndeep walk: {status}, {len(body)} bytes; daemon peak RSS grew {grown} KiB")
    assert status == 413, (status, len(body))
    answer = json.loads(body)
    assert answer["error"] == "TooLarge" and "SANDBOXD_WALK_BYTES_MAX" in answer["detail"]
    assert grown < RSS_BOUND, grown
    narrow = "/".join(["n" * 250] * 3 + ["f" * 200])
    status, body = daemon.call("GET", f"/sandboxes/{rid}/walk?root=/{narrow}")
    assert status == 200 and [e["path"] for e in json.loads(body)["entries"]] == [f"/{narrow}"]
