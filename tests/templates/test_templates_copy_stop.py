"""A build's copies stop when it is cancelled or runs past its time (docs/extensions.rst,
"Building a template"): ``COPY``'s extraction and ``FROM``'s ``cp`` ask as they go, in their
thread, instead of running to their end while the build waits. Real files, a real reactor and
a real thread pool, in the test's process."""

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import pytest_twisted
from twisted.python.threadpool import ThreadPool

from sandboxd.core.templates import build_files
from sandboxd.core.templates.build_events import BuildEvent, BuildFailed
from sandboxd.core.templates.build_limits import BuildLimits
from sandboxd.core.templates.builder import Build
from sandboxd.core.templates.dockerfile import parse_dockerfile
from sandboxd.core.templates.extract import Stopped
from sandboxd.core.templates.store import TemplateStore
from tests.templates.archives import directory, tar

BIG = 16 << 30
"""The ``COPY``'s file: far more than it can write before its stop (a sparse context: the
test's disk holds only what is written before the stop, then removed)."""
STOP_AFTER = 0.3
ENDED_WITHIN = 5.0
"""The build's end after the stop comes (a full copy of :data:`BIG` takes far longer)."""


def sparse_context(path: Path) -> Path:
    """A context tar whose one member, ``big``, is :data:`BIG` bytes of zeros (a hole)."""
    member = tarfile.TarInfo("big")
    member.size = BIG
    header = member.tobuf(tarfile.PAX_FORMAT)
    with open(path, "wb") as file:
        file.write(header)
        file.truncate(len(header) + BIG + 2 * tarfile.RECORDSIZE)  # content, then the end
    return path


@pytest.mark.parametrize("stop", ["timeout", "cancel"])
@pytest_twisted.ensureDeferred
async def test_a_long_copy_stops_when_its_build_is_cancelled_or_runs_past_its_time(
    tmp_path: Path, stop: str
) -> None:
    from twisted.internet import reactor

    pool = ThreadPool(minthreads=1, maxthreads=1, name="test-copy-stop")
    pool.start()
    try:
        root = tmp_path / "root"
        root.mkdir()
        store = TemplateStore.open(str(root), 1 << 40, False, reactor, pool)
        await store.put("base", io.BytesIO(tar([directory("etc")])))
        timeout = STOP_AFTER if stop == "timeout" else 600.0
        store.build_limits = BuildLimits(timeout=timeout)
        frames: list[BuildEvent] = []
        with open(sparse_context(tmp_path / "context.tar"), "rb") as context:
            store.reserve("big")
            steps = parse_dockerfile("FROM base\nCOPY big /big\n")
            build = Build(store, "big", steps, context, "none", frames.append)
            if stop == "cancel":
                reactor.callLater(STOP_AFTER, build.cancel)
            began = reactor.seconds()
            assert await build.run() is None
            took = reactor.seconds() - began
        end = frames[-1]
        assert isinstance(end, BuildFailed) and end.step == 2, frames
        expected = "(0.3 s, SANDBOXD_BUILD_TIMEOUT)" if stop == "timeout" else "cancelled"
        assert expected in end.error, end
        print(f"the COPY stopped ({stop}) {took - STOP_AFTER:.3f} s after its stop came")
        assert took < STOP_AFTER + ENDED_WITHIN, took
        assert sorted(os.listdir(root / ".templates")) == ["base"]
    finally:
        pool.stop()


def test_froms_cp_is_killed_when_told_to_stop(tmp_path: Path) -> None:
    """``cp`` of a base whose file takes it a while (256 MiB allocated, unwritten: ``cp``
    writes them): it goes on while the answer is no, is killed at the first yes, before its
    end, and ``Stopped`` is raised."""
    source = tmp_path / "source"
    source.mkdir()
    with open(source / "big", "wb") as file:
        os.posix_fallocate(file.fileno(), 0, 256 << 20)
    asked: list[bool] = []

    def stopped() -> bool:
        asked.append(True)
        return len(asked) > 1

    with pytest.raises(Stopped):
        build_files.copy_base(str(source), str(tmp_path / "target"), stopped)
    assert len(asked) == 2
    copied = tmp_path / "target" / "big"
    assert not copied.exists() or copied.stat().st_size < 256 << 20


def test_froms_cp_that_fails_says_why(tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        build_files.copy_base(str(tmp_path / "none"), str(tmp_path / "target"))
    assert b"No such file" in failed.value.stderr
