"""The archive's copies with real rsync against real directories (in process, real reactor)."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList, gatherResults
from twisted.internet.task import deferLater

from sandboxd.core.archive.rsync import Rsync
from sandboxd.core.archive.store import (
    STAGING,
    Archive,
    ArchiveUnavailable,
    build_archive,
)
from sandboxd.errors import ArchiveFailed
from sandboxd.http import wire
from sandboxd.isolation.exec.wrapper import Programs, Wrapper
from tests.archive.archive_helpers import ROOT, Workspaces, all_bytes, as_root, reactor, tree

SECRET = b"host-secret-6f1c2a"


def write_sample(root: Path) -> None:
    (root / "dir" / "deeper").mkdir(parents=True)
    (root / "dir" / "deeper" / "data.bin").write_bytes(bytes(range(256)) * 64)
    (root / "top.txt").write_bytes(b"top\n")
    (root / "empty").mkdir()
    script = root / "run.sh"
    script.write_bytes(b"#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    (root / "inside").symlink_to("dir/deeper/data.bin")


@pytest_twisted.ensureDeferred
async def test_restore_copies_files_links_and_modes_as_the_sandbox(
    archive: Archive, workspaces: Workspaces
) -> None:
    item = Path(archive.item("item-1"))
    item.mkdir()
    write_sample(item)
    (item / "outside").symlink_to("/etc")
    workspace, end = workspaces.new()

    assert await archive.restore("item-1", end) is True

    restored = tree(workspace)
    assert restored == tree(item)
    assert os.access(workspace / "run.sh", os.X_OK)
    owner = workspaces.identity
    for top, dirs, files in os.walk(workspace):
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(top, name))
            assert (st.st_uid, st.st_gid) == (owner.uid, owner.gid), name


@pytest_twisted.ensureDeferred
async def test_restore_of_an_item_without_an_entry_copies_nothing(
    archive: Archive, workspaces: Workspaces
) -> None:
    workspace, end = workspaces.new()
    assert await archive.restore("never-persisted", end) is False
    assert list(workspace.iterdir()) == []


@pytest_twisted.ensureDeferred
async def test_persist_then_restore_round_trips_byte_for_byte(
    archive: Archive, workspaces: Workspaces
) -> None:
    first, end = workspaces.new()
    write_sample(first)
    (first / "random.bin").write_bytes(os.urandom(3 << 20))
    workspaces.give(first)
    await archive.persist("round", end, delete=True)

    second, end2 = workspaces.new()
    assert await archive.restore("round", end2) is True
    assert tree(second) == tree(first)


@as_root
@pytest_twisted.ensureDeferred
async def test_the_shell_chain_carries_the_workspace_end_too(
    archive: Archive, workspaces: Workspaces
) -> None:
    """Where the helper was not built, the rsync end starts through the shell chain."""
    workspaces.wrap = Wrapper(Programs.find())
    first, end = workspaces.new()
    write_sample(first)
    workspaces.give(first)
    await archive.persist("shell", end, delete=True)
    second, end2 = workspaces.new()
    assert await archive.restore("shell", end2) is True
    assert tree(second) == tree(first)
    assert {os.lstat(second / name).st_uid for name in os.listdir(second)} == {
        workspaces.identity.uid
    }


@pytest_twisted.ensureDeferred
async def test_checkpoint_only_adds_and_reconcile_deletes(
    archive: Archive, workspaces: Workspaces
) -> None:
    workspace, end = workspaces.new()
    (workspace / "a").write_bytes(b"a1")
    (workspace / "b").write_bytes(b"b1")
    workspaces.give(workspace)
    await archive.persist("item", end, delete=False)
    item = Path(archive.item("item"))
    assert tree(item) == {"a": ("file", b"a1"), "b": ("file", b"b1")}

    (workspace / "b").unlink()
    (workspace / "a").write_bytes(b"a2-longer")
    (workspace / "c").write_bytes(b"c1")
    workspaces.give(workspace)
    await archive.persist("item", end, delete=False)
    assert tree(item) == {
        "a": ("file", b"a2-longer"),
        "b": ("file", b"b1"),
        "c": ("file", b"c1"),
    }, "a checkpoint updates and adds, never deletes"

    await archive.persist("item", end, delete=True)
    assert tree(item) == {"a": ("file", b"a2-longer"), "c": ("file", b"c1")}
    assert os.listdir(archive.staging) == []


@pytest_twisted.ensureDeferred
async def test_a_checkpoint_never_changes_the_current_version_in_place(
    archive: Archive, workspaces: Workspaces
) -> None:
    """Unchanged files are hard links of the previous version; changed ones are new inodes."""
    workspace, end = workspaces.new()
    (workspace / "same").write_bytes(b"same")
    (workspace / "changes").write_bytes(b"v1")
    workspaces.give(workspace)
    await archive.persist("item", end, delete=False)
    item = Path(archive.item("item"))
    before = os.stat(item / "changes")
    held = open(item / "changes", "rb")  # noqa: SIM115 (the old inode, held open)
    try:
        (workspace / "changes").write_bytes(b"v2 bigger")
        await archive.persist("item", end, delete=False)
        assert held.read() == b"v1"
    finally:
        held.close()
    assert os.stat(item / "changes").st_ino != before.st_ino
    assert (item / "changes").read_bytes() == b"v2 bigger"


@pytest_twisted.ensureDeferred
async def test_links_to_host_files_never_bring_their_content_into_the_archive(
    archive: Archive, workspaces: Workspaces, scratch: Path
) -> None:
    host = scratch / "host"
    host.mkdir()
    (host / "secret").write_bytes(SECRET)
    (host / "secret").chmod(0o600)
    workspace, end = workspaces.new()
    (workspace / "shadow").symlink_to("/etc/shadow")
    (workspace / "hostdir").symlink_to(host)
    (workspace / "rel").symlink_to("../../../host/secret")
    (workspace / "plain").write_bytes(b"ok")
    workspaces.give(workspace)

    await archive.persist("item", end, delete=True)

    item = Path(archive.item("item"))
    stored = tree(item)
    assert stored["plain"] == ("file", b"ok")
    for name in ("shadow", "hostdir", "rel"):
        kind, target = stored[name]
        assert kind == "link"
        assert target.startswith("/rsyncd-munged/"), "archived links are never followable"
    assert SECRET not in all_bytes(item)
    shadow = Path("/etc/shadow")
    if ROOT and shadow.exists():
        assert shadow.read_bytes() not in all_bytes(item)

    # And they come back as the links they were.
    again, end2 = workspaces.new()
    await archive.restore("item", end2)
    assert os.readlink(again / "shadow") == "/etc/shadow"
    assert os.readlink(again / "hostdir") == str(host)


@pytest_twisted.ensureDeferred
async def test_a_hard_link_or_file_the_sandbox_cannot_read_fails_and_leaves_the_archive(
    archive: Archive, workspaces: Workspaces, scratch: Path
) -> None:
    """The workspace end reads as the sandbox: a file in its workspace it cannot read (as root:
    a hard link to a root-only host file; else a mode-000 file) fails the copy, and the archive
    stays as it was."""
    workspace, end = workspaces.new()
    (workspace / "kept").write_bytes(b"kept")
    workspaces.give(workspace)
    await archive.persist("item", end, delete=False)
    item = Path(archive.item("item"))
    before = tree(item)

    (workspace / "new-file").write_bytes(b"new")
    workspaces.give(workspace)
    host_file = scratch / "root-only"
    host_file.write_bytes(SECRET)
    host_file.chmod(0o600 if ROOT else 0o000)
    os.link(host_file, workspace / "hardlink")

    with pytest.raises(ArchiveFailed) as failed:
        await archive.persist("item", end, delete=False)
    assert wire.status_and_type(failed.value)[0] == 500
    assert "rsync exited" in failed.value.detail
    assert tree(item) == before, "a failed checkpoint leaves the archive as it was"
    host_file.chmod(0o600)
    assert os.listdir(archive.staging) == []
    assert SECRET not in all_bytes(Path(archive.root))


@as_root
@pytest_twisted.ensureDeferred
async def test_a_component_swapped_for_a_link_mid_copy_never_leaks_host_files(
    archive: Archive, workspaces: Workspaces, scratch: Path
) -> None:
    """A sandbox racing persist, swapping a directory for a link to a host directory and back:
    whatever rsync meets, it reads as the sandbox, so the host file never reaches the archive."""
    host = scratch / "host"
    host.mkdir()
    for index in range(50):
        (host / f"f{index}").write_bytes(SECRET)
        (host / f"f{index}").chmod(0o600)
    workspace, end = workspaces.new()
    real = workspace / "d"
    real.mkdir()
    for index in range(50):
        (real / f"f{index}").write_bytes(b"mine")
    workspaces.give(workspace)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(real, workspace / "d.real")
            os.symlink(host, real)
            os.unlink(real)
            os.rename(workspace / "d.real", real)

    racer = threading.Thread(target=swap)
    racer.start()
    try:
        for _ in range(10):
            with contextlib.suppress(ArchiveFailed):  # a vanished directory may fail a copy
                await archive.persist("race", end, delete=True)
    finally:
        stop.set()
        racer.join()
    assert SECRET not in all_bytes(Path(archive.root))


@pytest_twisted.ensureDeferred
async def test_a_rewrite_of_the_same_size_in_the_same_second_is_persisted(
    archive: Archive, workspaces: Workspaces
) -> None:
    workspace, end = workspaces.new()
    target = workspace / "f"
    target.write_bytes(b"AAAA")
    os.utime(target, ns=(1_700_000_000_100_000_000, 1_700_000_000_100_000_000))
    workspaces.give(workspace)
    await archive.persist("item", end, delete=False)
    target.write_bytes(b"BBBB")
    os.utime(target, ns=(1_700_000_000_200_000_000, 1_700_000_000_200_000_000))
    await archive.persist("item", end, delete=False)
    assert (Path(archive.item("item")) / "f").read_bytes() == b"BBBB"
    await archive.persist("item", end, delete=True)
    assert (Path(archive.item("item")) / "f").read_bytes() == b"BBBB"


@pytest_twisted.ensureDeferred
async def test_links_in_the_archive_never_make_restore_write_outside_the_workspace(
    archive: Archive, workspaces: Workspaces, scratch: Path
) -> None:
    outside = scratch / "outside"
    outside.mkdir()
    (outside / "existing").write_bytes(b"untouched")
    item = Path(archive.item("evil"))
    item.mkdir()
    (item / "abs").symlink_to(outside)
    (item / "up").symlink_to("../../../outside")
    (item / "munged").symlink_to("/rsyncd-munged/" + str(outside))
    (item / "existing").write_bytes(b"from the archive")
    (item / "sub").mkdir()
    (item / "sub" / "existing").write_bytes(b"from the archive")
    workspace, end = workspaces.new()

    await archive.restore("evil", end)

    assert tree(outside) == {"existing": ("file", b"untouched")}
    assert (workspace / "existing").read_bytes() == b"from the archive"
    assert os.readlink(workspace / "munged") == str(outside)
    assert os.readlink(workspace / "abs") == str(outside)


class CountingRsync:
    """An :class:`Rsync` that records how many copies of the workspace run at once."""

    def __init__(self, real: Rsync, watched: set[str]) -> None:
        self.real = real
        self.reactor = real.reactor
        self.watched = watched
        self.running = 0
        self.most = 0
        self.order: list[str] = []

    def local(self, args: Any) -> Deferred[None]:
        return self.real.local(args)

    def with_workspace(self, end: Any, args: Any) -> Deferred[None]:
        if end.path not in self.watched:
            return self.real.with_workspace(end, args)
        self.running += 1
        self.most = max(self.most, self.running)
        self.order.append(end.path)

        def done(result: object) -> object:
            self.running -= 1
            return result

        return self.real.with_workspace(end, args).addBoth(done)


@pytest_twisted.ensureDeferred
async def test_persists_of_one_item_never_interleave(
    archive: Archive, workspaces: Workspaces
) -> None:
    ends = []
    for index in range(6):
        workspace, end = workspaces.new()
        (workspace / "who").write_bytes(str(index).encode())
        (workspace / f"only-{index}").write_bytes(os.urandom(1 << 20))
        workspaces.give(workspace)
        ends.append(end)
    other, other_end = workspaces.new()
    (other / "x").write_bytes(b"x")
    workspaces.give(other)

    counting = CountingRsync(archive.rsync, {end.path for end in ends})
    archive.rsync = counting  # type: ignore[assignment]
    runs = [archive.persist("shared", end, delete=True) for end in ends]
    runs.append(archive.persist("other-item", other_end, delete=True))
    await gatherResults(runs, consumeErrors=True)

    assert counting.most == 1, "one persist of an item at a time"
    assert counting.order == [end.path for end in ends], "in the order they were asked"
    item = Path(archive.item("shared"))
    assert (item / "who").read_bytes() == b"5", "the last persist wins, whole"
    assert sorted(os.listdir(item)) == ["only-5", "who"]
    assert (Path(archive.item("other-item")) / "x").read_bytes() == b"x"
    assert os.listdir(archive.staging) == []
    assert archive._locks == {}


@pytest_twisted.ensureDeferred
async def test_a_cancelled_persist_still_completes(
    archive: Archive, workspaces: Workspaces
) -> None:
    workspace, end = workspaces.new()
    (workspace / "f").write_bytes(b"data")
    workspaces.give(workspace)
    running = archive.persist("item", end, delete=True)
    running.cancel()
    results = await DeferredList([running], consumeErrors=True)
    assert results[0][0] is False
    for _ in range(400):
        if (Path(archive.item("item")) / "f").exists() and not os.listdir(archive.staging):
            break
        await deferLater(reactor(), 0.01, lambda: None)
    assert (Path(archive.item("item")) / "f").read_bytes() == b"data"


@pytest_twisted.ensureDeferred
async def test_a_swap_a_crash_interrupted_is_repaired(
    archive: Archive, workspaces: Workspaces
) -> None:
    workspace, end = workspaces.new()
    (workspace / "f").write_bytes(b"v1")
    workspaces.give(workspace)
    await archive.persist("item", end, delete=True)
    # A crash between the two renames of the fallback swap: the item is set aside.
    _, old = archive._names("item")
    os.rename(archive.item("item"), old)

    again, end2 = workspaces.new()
    assert await archive.restore("item", end2) is True
    assert (again / "f").read_bytes() == b"v1"
    assert os.listdir(archive.staging) == []


def test_the_archive_root_is_private_and_the_staging_name_reserved(
    archive: Archive, scratch: Path
) -> None:
    for path in (archive.root, archive.staging):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert os.path.basename(archive.staging) == STAGING


def test_without_rsync_the_archive_refuses_to_start(scratch: Path, pool: Any) -> None:
    with pytest.raises(ArchiveUnavailable, match="rsync not found"):
        build_archive(str(scratch / "a"), reactor(), pool, search_path=str(scratch))


def test_an_uncreatable_archive_root_refuses_to_start(scratch: Path, pool: Any) -> None:
    (scratch / "file").write_bytes(b"")
    with pytest.raises(ArchiveUnavailable, match="SANDBOXD_ARCHIVE_ROOT"):
        build_archive(str(scratch / "file" / "archive"), reactor(), pool)


def test_an_rsync_too_old_for_munged_links_refuses_to_start(scratch: Path, pool: Any) -> None:
    fake = scratch / "bin" / "rsync"
    fake.parent.mkdir()
    fake.write_bytes(b"#!/bin/sh\necho 'rsync  version 3.1.2  protocol version 31'\n")
    fake.chmod(0o755)
    with pytest.raises(ArchiveUnavailable, match=r"version 3\.1\.2; the archive needs 3\.1\.3"):
        build_archive(str(scratch / "a"), reactor(), pool, search_path=str(fake.parent))


@pytest.mark.parametrize("item_id", ["", ".", "..", "a/b", "../x", "x\0", ".sandboxd-staging"])
def test_the_archive_itself_refuses_item_ids_that_are_not_one_plain_name(
    archive: Archive, item_id: str
) -> None:
    with pytest.raises(ArchiveFailed):
        archive.item(item_id)
