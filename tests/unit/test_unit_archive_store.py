"""The archive's own logic (``sandboxd.core.archive.store``) on real files in a temporary
directory, a recording reactor and a synchronous pool: the exchange and its fall-back, the host
checks, work that fails after its caller left, stale staging trees, and the rsync version."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone
from twisted.internet.interfaces import IReactorProcess
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from sandboxd.core.archive import store
from sandboxd.core.archive.rsync import REMOTE, Rsync, WorkspaceEnd
from sandboxd.core.archive.store import (
    STAGING,
    Archive,
    ArchiveUnavailable,
    build_archive,
    check_host,
    detached,
    exchange,
    rsync_version,
)
from tests.support.fakes import FakeReactor, SyncPool


def versions(tmp_path: Path) -> tuple[str, str, str]:
    """``new`` and ``current`` directories, each holding a file naming it; ``old`` unused."""
    for name in ("new", "current"):
        (tmp_path / name).mkdir()
        (tmp_path / name / name).write_bytes(b"")
    return str(tmp_path / "new"), str(tmp_path / "current"), str(tmp_path / "old")


def test_the_exchange_swaps_in_one_step(tmp_path: Path) -> None:
    new, current, old = versions(tmp_path)
    exchange(new, current, old)
    assert os.listdir(current) == ["new"]
    assert os.listdir(old) == ["current"]
    assert not os.path.exists(new)


def test_an_exchange_that_fails_for_a_real_reason_is_raised(tmp_path: Path) -> None:
    new, _, old = versions(tmp_path)
    with pytest.raises(FileNotFoundError):
        exchange(new, str(tmp_path / "missing"), old)
    assert os.listdir(new) == ["new"]


def no_exchange_here(a: str, b: str) -> None:
    raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), a)


@pytest.mark.parametrize(
    "call", [no_exchange_here, None], ids=["filesystem-lacks-it", "libc-lacks-it"]
)
def test_without_an_exchange_two_renames_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: Callable[[str, str], None] | None
) -> None:
    monkeypatch.setattr(store, "_EXCHANGE", call)
    new, current, old = versions(tmp_path)
    exchange(new, current, old)
    assert os.listdir(current) == ["new"]
    assert os.listdir(old) == ["current"]
    assert not os.path.exists(new)


def test_a_c_library_without_renameat2_has_no_exchange() -> None:
    class OldLibc:
        pass

    assert store._renameat2(OldLibc()) is None


def test_an_existing_munge_directory_refuses_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    munged = tmp_path / "rsyncd-munged"
    munged.symlink_to("/")  # even a link: it could make munged links resolve
    monkeypatch.setattr(store, "MUNGE_PREFIX_DIR", str(munged))
    with pytest.raises(ArchiveUnavailable, match=r"archived symlinks .* could resolve"):
        check_host(str(tmp_path / "archive"))


def test_a_relative_archive_root_is_refused() -> None:
    with pytest.raises(ArchiveUnavailable, match="archive is not absolute"):
        check_host("archive")


def test_work_that_fails_after_its_caller_left_is_logged_not_left_unhandled() -> None:
    work: Deferred[int] = Deferred()
    answer = detached(work)
    answer.cancel()
    answer.addErrback(lambda f: f.trap(Exception))  # the caller's own CancelledError
    with capturedLogs() as events:
        work.errback(Failure(OSError("disk gone")))
    (event,) = events
    assert event["log_format"] == "archive work finished after its caller left"
    assert isinstance(event["log_failure"].value, OSError)
    assert work.result is None  # consumed: no "Unhandled error in Deferred"


def test_restore_removes_the_items_stale_staging_trees_and_no_others(tmp_path: Path) -> None:
    reactor = FakeReactor()
    rsync = Rsync(cast(IReactorProcess, reactor), "/usr/bin/rsync")
    archive = Archive(str(tmp_path / "archive"), rsync, cast(ThreadPool, SyncPool()))
    archive.prepare()
    (tmp_path / "archive" / "item").mkdir()
    prefix, old = archive._names("item")
    others = archive._names("other")[0] + "building"
    for leftover in (prefix + "crashed", old, others):
        os.mkdir(leftover)

    restored = archive.restore("item", WorkspaceEnd(str(tmp_path / "workspace"), list))

    assert os.listdir(tmp_path / "archive" / STAGING) == [os.path.basename(others)]
    (spawn,) = reactor.spawned
    assert spawn["args"][-2:] == [str(tmp_path / "archive" / "item") + "/", REMOTE]
    reactor.protocol.processEnded(Failure(ProcessDone(0)))
    assert restored.result is True


def test_an_rsync_that_does_not_run_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ArchiveUnavailable, match="does not run"):
        rsync_version(str(tmp_path / "no-rsync"))


def test_an_rsync_that_shows_no_version_is_unavailable() -> None:
    with pytest.raises(ArchiveUnavailable, match="shows no version"):
        rsync_version("/bin/true")


def test_an_rsync_before_the_cve_fixes_starts_with_a_warning(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "rsync"
    fake.parent.mkdir()
    fake.write_bytes(b"#!/bin/sh\necho 'rsync  version 3.2.7  protocol version 31'\n")
    fake.chmod(0o755)
    reactor: Any = FakeReactor()
    with capturedLogs() as events:
        archive = build_archive(
            str(tmp_path / "a"), reactor, cast(ThreadPool, SyncPool()), str(fake.parent)
        )
    assert archive.rsync.rsync == str(fake)
    warnings = [e for e in events if "predates the 3.4.0 fixes" in e["log_format"]]
    assert [e["version"] for e in warnings] == ["3.2.7"]
