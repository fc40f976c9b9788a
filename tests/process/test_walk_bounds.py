"""Walks of huge and deep trees against a real daemon: memory stays bounded, the answer is
``413`` past ``SANDBOXD_WALK_MAX``, and paths past ``PATH_MAX`` are listed like any other.

The trees are made directly in the sandbox's workspace (``--isolation=none``: the daemon's own
user owns it), modest in size, in the test's temporary directory.
"""

import json
import os
import threading
from pathlib import Path

from tests.support.daemon import Daemon, start_daemon, stop_daemon

FILES = 100_000
DEEP = 3_000  # levels of a one-letter directory: paths up to 6 000 bytes


def workspace(daemon: Daemon, rid: str) -> Path:
    return daemon.root / rid / "workspace"


def make_files(where: Path, count: int) -> None:
    for d in range(count // 1000):
        sub = where / f"dir{d:03d}"
        sub.mkdir()
        fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for n in range(1000):
                os.close(os.open(f"file-{n:04d}.txt", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
        finally:
            os.close(fd)


def make_deep(where: Path, depth: int) -> None:
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            if level % 100 == 0:
                os.close(os.open(f"f{level}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)


def test_huge_and_deep_walks_keep_the_daemon_bounded(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none", f"--walk-max={FILES + 50}")
    try:
        rid = daemon.create()
        make_files(workspace(daemon, rid), FILES)
        make_deep(workspace(daemon, rid), DEEP)
        before = daemon.rss_kib("VmHWM")
        answers: list[tuple[int, bytes]] = []

        def walk() -> None:
            answers.append(daemon.call("GET", f"/sandboxes/{rid}/walk?root=/"))

        walkers = [threading.Thread(target=walk) for _ in range(4)]
        for walker in walkers:
            walker.start()
        for walker in walkers:
            walker.join(300)
        peak = daemon.rss_kib("VmHWM")
        assert [status for status, _ in answers] == [200] * 4
        entries = json.loads(answers[0][1])["entries"]
        # Written a part at a time, and still the very bytes json.dumps gives
        # (docs/contract.rst, "Conventions").
        assert answers[0][1] == json.dumps({"entries": entries}).encode()
        deep = [e["path"] for e in entries if not e["path"].startswith("/dir")]
        # Every deep file is listed, those whose path is past PATH_MAX too.
        assert len(entries) == FILES + DEEP // 100
        assert max(len(p) for p in deep) > 4096
        # Four concurrent walks of 100 000 files, each written a part at a time (the answer
        # is 7 MiB): no walk holds its whole answer.
        assert peak - before < 100 * 1024, (before, peak)
        # One file more than the limit: 413 naming it, and the daemon still answers.
        make_files(workspace(daemon, rid) / "dir000", 1000)
        status, body = daemon.call("GET", f"/sandboxes/{rid}/walk?root=/")
        assert status == 413, body
        assert f"more than {FILES + 50} files (SANDBOXD_WALK_MAX)" in json.loads(body)["detail"]
        assert daemon.call("GET", "/healthz")[0] == 200
    finally:
        stop_daemon(daemon)
