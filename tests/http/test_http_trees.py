"""Trees as tar streams (``files.tree``): ``PUT``/``GET /sandboxes/{rid}/tree`` over the
in-memory harness, and the unpacker's and packer's refusals and edge cases.

Downloads are paced by the response's producer, so those tests run the real reactor
(pytest-twisted); uploads answer within one in-memory flush.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.web.client import ResponseFailed

from sandboxd.core.files import tar_in, tar_out
from sandboxd.core.files.paths import normalise
from tests.http.http_harness import Harness

MTIME = 1_600_000_000


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, None if data is None else io.BytesIO(data))
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"", mode: int = 0o644,
           link: str = "") -> tuple[tarfile.TarInfo, bytes | None]:  # fmt: skip
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = MTIME
    info.linkname = link
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def put_tree(h: Harness, rid: str, body: bytes, path: str = "/") -> tuple[int, str, str]:
    reply = h.call("PUT", f"/sandboxes/{rid}/tree", params={"path": path}, data=body)
    if reply.status == 204:
        return 204, "", ""
    status, kind = reply.error()
    return status, kind, reply.json()["detail"]


def members_of(data: bytes) -> dict[str, tuple[bytes, int, int, bytes | str]]:
    """name → (type, mode, mtime, data or link target)."""
    found: dict[str, tuple[bytes, int, int, bytes | str]] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as archive:
        for info in archive:
            content: bytes | str = info.linkname
            if info.isreg():
                f = archive.extractfile(info)
                assert f is not None
                content = f.read()
            found[info.name] = (info.type, info.mode, int(info.mtime), content)
    return found


@pytest.fixture
def rid(harness: Harness) -> str:
    return harness.create()


SAMPLE = (
    member("bin/", tarfile.DIRTYPE, mode=0o755),
    member("bin/gradlew", data=b"#!/bin/sh\necho hi\n", mode=0o755),
    member("bin/run", tarfile.SYMTYPE, link="gradlew"),
    member("abs", tarfile.SYMTYPE, link="/etc/hostname"),
    member("empty/", tarfile.DIRTYPE, mode=0o750),
    member("./readonly/", tarfile.DIRTYPE, mode=0o555),
    member("readonly/inside", data=b"x" * 3000, mode=0o600),
    member("./", tarfile.DIRTYPE),
)


def test_upload_keeps_modes_links_empty_dirs_and_mtimes(harness: Harness, rid: str) -> None:
    assert put_tree(harness, rid, tar_of(*SAMPLE), "/project")[0] == 204
    top = Path(harness.workspace(rid)) / "project"
    gradlew = top / "bin" / "gradlew"
    assert gradlew.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE(gradlew.stat().st_mode) == 0o755
    assert int(gradlew.stat().st_mtime) == MTIME
    assert os.readlink(top / "bin" / "run") == "gradlew"
    assert os.readlink(top / "abs") == "/etc/hostname"
    assert int(os.lstat(top / "abs").st_mtime) == MTIME
    assert list((top / "empty").iterdir()) == []
    assert stat.S_IMODE((top / "empty").stat().st_mode) == 0o750
    assert stat.S_IMODE((top / "readonly").stat().st_mode) == 0o555
    assert int((top / "readonly").stat().st_mtime) == MTIME
    assert (top / "readonly" / "inside").read_bytes() == b"x" * 3000
    assert sorted(os.listdir(top / "bin")) == ["gradlew", "run"]  # no temporary left


@pytest_twisted.ensureDeferred
async def test_tree_round_trips_through_download(harness: Harness, rid: str) -> None:
    assert put_tree(harness, rid, tar_of(*SAMPLE), "/p")[0] == 204
    fifo = Path(harness.workspace(rid)) / "p" / "fifo"
    os.mkfifo(fifo)  # not a member: left out
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree", params={"path": "/p"})
    assert reply.status == 200
    assert reply.header("content-type") == "application/x-tar"
    got = members_of(reply.body)
    assert got == {
        "abs": (tarfile.SYMTYPE, 0o777, MTIME, "/etc/hostname"),
        "bin": (tarfile.DIRTYPE, 0o755, MTIME, ""),
        "bin/gradlew": (tarfile.REGTYPE, 0o755, MTIME, b"#!/bin/sh\necho hi\n"),
        "bin/run": (tarfile.SYMTYPE, 0o777, MTIME, "gradlew"),
        "empty": (tarfile.DIRTYPE, 0o750, MTIME, ""),
        "readonly": (tarfile.DIRTYPE, 0o555, MTIME, ""),
        "readonly/inside": (tarfile.REGTYPE, 0o600, MTIME, b"x" * 3000),
    }
    assert len(reply.body) % tarfile.RECORDSIZE == 0


@pytest_twisted.ensureDeferred
async def test_download_of_a_file_a_link_the_root_and_a_missing_path(
    harness: Harness, rid: str
) -> None:
    assert put_tree(harness, rid, tar_of(*SAMPLE[:4]))[0] == 204
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree", params={"path": "bin/gradlew"})
    assert list(members_of(reply.body)) == ["gradlew"]
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree", params={"path": "abs"})
    assert members_of(reply.body) == {"abs": (tarfile.SYMTYPE, 0o777, MTIME, "/etc/hostname")}
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree")
    assert sorted(members_of(reply.body)) == ["abs", "bin", "bin/gradlew", "bin/run"]
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree", params={"path": "nope"})
    assert reply.error() == (404, "FileNotFoundError")
    os.mkfifo(Path(harness.workspace(rid)) / "pipe")
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree", params={"path": "pipe"})
    assert reply.error()[0] == 400


@pytest_twisted.ensureDeferred
async def test_a_large_file_streams_in_parts(harness: Harness, rid: str) -> None:
    data = os.urandom(tar_out.PART * 2 + 12345)
    assert put_tree(harness, rid, tar_of(member("big", data=data)), "d")[0] == 204
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree", params={"path": "d"})
    assert members_of(reply.body)["big"][3] == data


@pytest_twisted.ensureDeferred
async def test_a_failure_mid_stream_ends_the_answer_unfinished(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(tar_out.PART * 2)
    assert put_tree(harness, rid, tar_of(member("big", data=data)))[0] == 204
    steps = []
    real_step = tar_out.Stepper.step

    def failing(self: tar_out.Stepper) -> bytes | None:
        steps.append(1)
        if len(steps) > 1:
            raise OSError(errno.EIO, "I/O error")
        return real_step(self)

    monkeypatch.setattr(tar_out.Stepper, "step", failing)
    with pytest.raises(ResponseFailed):
        await harness.acall("GET", f"/sandboxes/{rid}/tree")


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (member("../x", data=b"evil"), "'../x': a '..' component"),
        (member("a/../../x", data=b"evil"), "a '..' component"),
        (member("/abs/x", data=b"evil"), "'/abs/x': an absolute name"),
        (member("hard", tarfile.LNKTYPE, link="ok"), "'hard': a hard link"),
        (member("dev", tarfile.CHRTYPE), "'dev': a device"),
        (member("blk", tarfile.BLKTYPE), "'blk': a device"),
        (member("fifo", tarfile.FIFOTYPE), "'fifo': a device, FIFO"),
    ],
)
def test_refused_members_are_named_and_nothing_lands_outside(
    harness: Harness, rid: str, bad: tuple[tarfile.TarInfo, bytes | None], says: str
) -> None:
    status, kind, detail = put_tree(harness, rid, tar_of(member("ok", data=b"1"), bad), "in")
    assert (status, kind) == (400, "BadRequest")
    assert says in detail
    workspace = Path(harness.workspace(rid))
    assert not (workspace.parent / "x").exists()
    assert not (workspace / "x").exists()
    assert sorted(os.listdir(workspace / "in")) == ["ok"]


@pytest.mark.parametrize("through", ["esc/payload", "esc/sub/"])
def test_nothing_is_written_through_a_symlink_member(
    harness: Harness, rid: str, tmp_path: Path, through: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    kind = tarfile.DIRTYPE if through.endswith("/") else tarfile.REGTYPE
    body = tar_of(
        member("esc", tarfile.SYMTYPE, link=str(outside)), member(through, kind, data=b"evil")
    )
    status, _, detail = put_tree(harness, rid, body)
    assert status == 400
    assert f"{through.rstrip('/')!r}: a symlink or a file is in its way" in detail
    assert list(outside.iterdir()) == []


def test_a_file_replaces_a_symlink_itself_never_its_target(
    harness: Harness, rid: str, tmp_path: Path
) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    body = tar_of(member("l", tarfile.SYMTYPE, link=str(target)), member("l", data=b"new"))
    assert put_tree(harness, rid, body)[0] == 204
    assert target.read_bytes() == b"keep"
    assert (Path(harness.workspace(rid)) / "l").read_bytes() == b"new"


def test_what_is_in_the_way_is_named(harness: Harness, rid: str) -> None:
    assert put_tree(harness, rid, tar_of(member("d/", tarfile.DIRTYPE), member("f")))[0] == 204
    status, _, detail = put_tree(harness, rid, tar_of(member("d", data=b"x")))
    assert (status, detail) == (400, "member 'd': a directory is in its way")
    status, _, detail = put_tree(harness, rid, tar_of(member("d", tarfile.SYMTYPE, link="f")))
    assert (status, detail) == (400, "member 'd': a directory is in its way")
    status, _, detail = put_tree(harness, rid, tar_of(member("f/", tarfile.DIRTYPE)))
    assert (status, detail) == (400, "member 'f': a file or symlink is in its way")
    status, _, detail = put_tree(harness, rid, tar_of(member("x")), "f")
    assert (status, detail) == (400, "/f: Not a directory")
    status, _, detail = put_tree(harness, rid, tar_of(member("f/x")))
    assert status == 400 and "'f/x': a symlink or a file" in detail


def test_a_body_that_is_not_a_tar_is_400(harness: Harness, rid: str) -> None:
    status, _, detail = put_tree(harness, rid, b"not a tar at all" * 100)
    assert status == 400 and detail.startswith("body: not a tar stream")


def test_a_full_disk_is_507_naming_the_member_and_leaves_no_temporary(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object) -> None:
        raise OSError(errno.EDQUOT, "quota")

    monkeypatch.setattr(shutil, "copyfileobj", full)
    status, kind, detail = put_tree(harness, rid, tar_of(member("big", data=b"x" * 100)))
    assert (status, kind, detail) == (507, "InsufficientStorage", "member 'big': no space left")
    assert os.listdir(harness.workspace(rid)) == []


def test_other_errors_name_the_member(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "denied")

    monkeypatch.setattr(os, "symlink", denied)
    status, _, detail = put_tree(harness, rid, tar_of(member("l", tarfile.SYMTYPE, link="x")))
    assert (status, detail) == (400, "member 'l': Permission denied")


def test_a_member_with_an_empty_name_is_refused(harness: Harness, rid: str) -> None:
    status, _, detail = put_tree(harness, rid, tar_of(member("./", data=b"")))
    assert (status, detail) == (400, "member './': names no file")


def test_directories_past_the_deferred_bound_are_set_at_once(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tar_in, "DEFERRED_DIRS_MAX", 1)
    body = tar_of(member("a/", tarfile.DIRTYPE, mode=0o711), member("b/", tarfile.DIRTYPE))
    assert put_tree(harness, rid, body)[0] == 204
    mode = os.stat(Path(harness.workspace(rid)) / "b").st_mode
    assert stat.S_IMODE(mode) == 0o644  # set at once, as the member says


def test_a_directory_that_went_before_the_end_is_named(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tar_in.Unpacker.finish

    def remove_then_finish(self: tar_in.Unpacker) -> None:
        os.rmdir(Path(harness.workspace(rid)) / "gone")
        real(self)

    monkeypatch.setattr(tar_in.Unpacker, "finish", remove_then_finish)
    status, _, detail = put_tree(harness, rid, tar_of(member("gone/", tarfile.DIRTYPE)))
    assert (status, detail) == (400, "member 'gone': No such file or directory")


# The packer on its own


def test_the_packer_leaves_out_what_changed_and_foreign_hard_links(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a").write_bytes(os.urandom(tar_out.PART + 10))
    (workspace / "b").write_bytes(b"b")
    (workspace / "c").symlink_to("b")
    (workspace / "d").mkdir()
    (workspace / "e").write_bytes(b"e")
    os.link(workspace / "e", tmp_path / "e-link")  # two links, not the owner's
    parts = tar_out.pack(str(workspace), normalise("/"), owner=os.getuid() + 1)
    first = next(parts)  # within "a"
    (workspace / "a").write_bytes(b"short")  # shrinks: zeros make up the length
    os.unlink(workspace / "b")
    os.unlink(workspace / "c")
    os.rmdir(workspace / "d")
    stream = first + b"".join(parts)
    got = members_of(stream)
    assert sorted(got) == ["a"]
    assert len(got["a"][3]) == tar_out.PART + 10


def test_the_packer_skips_a_file_swapped_after_its_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f").write_bytes(b"f")
    (workspace / "l").symlink_to("f")
    real_open = os.open

    def refused(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "f":
            raise OSError(errno.ELOOP, "swapped for a link")
        return real_open(path, flags, *args, **kwargs)

    def unreadable(path: str, **kwargs: object) -> str:
        raise OSError(errno.EINVAL, "no link any more")

    monkeypatch.setattr(os, "open", refused)
    monkeypatch.setattr(os, "readlink", unreadable)
    stream = b"".join(tar_out.pack(str(workspace), (), owner=os.getuid()))
    assert members_of(stream) == {}


def test_the_packer_skips_a_subdirectory_swapped_after_its_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "d").mkdir(parents=True)
    real_open = os.open

    def refused(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "d":
            raise OSError(errno.ENOTDIR, "swapped")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    stream = b"".join(tar_out.pack(str(workspace), (), owner=os.getuid()))
    assert list(members_of(stream)) == ["d"]


def test_a_stepper_closed_while_it_steps_closes_its_generator_then() -> None:
    closed: list[bool] = []

    def parts() -> Generator[bytes, None, None]:
        try:
            stepper.close()  # from "another thread": the step holds the lock
            yield b"one"
            yield b"two"
        finally:
            closed.append(True)

    stepper = tar_out.Stepper(parts())
    assert stepper.step() == b"one"
    assert closed == [True]
    assert stepper.step() is None
    idle = tar_out.Stepper(iter_once())
    idle.close()
    assert idle.step() is None


def iter_once() -> Generator[bytes, None, None]:
    yield b"x"


@pytest_twisted.ensureDeferred
async def test_many_small_files_and_a_second_upload_over_the_first(
    harness: Harness, rid: str
) -> None:
    files = [member(f"many/{i:04}", data=b"%04d" % i * 125) for i in range(1100)]
    body = tar_of(member("many/", tarfile.DIRTYPE), *files)
    assert put_tree(harness, rid, body)[0] == 204
    assert put_tree(harness, rid, body)[0] == 204  # the directory is there: kept, files replaced
    reply = await harness.acall("GET", f"/sandboxes/{rid}/tree", params={"path": "many"})
    got = members_of(reply.body)
    assert len(got) == 1100
    assert got["0042"][3] == b"0042" * 125
