"""Unpacking a tool (``sandboxd.core.tools.unpack``) on real files in a temporary directory:
the members the resolver tests do not reach (the top directory, hard links, unknown types,
too many entries, a broken archive) and an install that finds its place taken."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import IO

import pytest

from sandboxd.core.tools.fetch import ToolRefused
from sandboxd.core.tools.unpack import TEMP, UnpackLimits, install, unpack
from tests.tools.tools_helpers import add_entry, add_file, tarball

SHA = "ab" * 32


def archive(*members: tuple[str, bytes, str]) -> io.BytesIO:
    """A ``.tar.gz`` of ``(name, type, data or link target)`` members."""

    def add(tar: tarfile.TarFile) -> None:
        for name, kind, payload in members:
            if kind == tarfile.REGTYPE:
                add_file(tar, name, payload.encode(), 0o755)
            else:
                add_entry(tar, name, kind, payload)

    return io.BytesIO(tarball(add))


def test_the_top_directory_and_a_hard_link_to_a_file_unpack(tmp_path: Path) -> None:
    unpack(
        archive(
            (".", tarfile.DIRTYPE, ""),
            ("./bin/tool", tarfile.REGTYPE, "run"),
            ("bin/alias", tarfile.LNKTYPE, "bin/tool"),
        ),
        str(tmp_path),
        UnpackLimits(),
    )
    tool, alias = tmp_path / "bin" / "tool", tmp_path / "bin" / "alias"
    assert alias.read_bytes() == b"run"
    assert os.stat(alias).st_ino == os.stat(tool).st_ino
    assert sorted(os.listdir(tmp_path)) == ["bin"]


@pytest.mark.parametrize(
    ("target", "reason"),
    [("bin/missing", "links to no file"), ("bin", "links to no file"), ("", "links to no file")],
)
def test_a_hard_link_to_no_file_is_refused(tmp_path: Path, target: str, reason: str) -> None:
    with pytest.raises(ToolRefused, match=reason):
        unpack(
            archive(("bin/tool", tarfile.REGTYPE, "run"), ("bin/l", tarfile.LNKTYPE, target)),
            str(tmp_path),
            UnpackLimits(),
        )


def test_a_member_of_an_unknown_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolRefused, match="'odd' is of an unsupported type"):
        unpack(archive(("odd", b"Z", "")), str(tmp_path), UnpackLimits())


def test_more_members_than_the_limit_are_refused(tmp_path: Path) -> None:
    three = archive(*((f"f{i}", tarfile.REGTYPE, "x") for i in range(3)))
    with pytest.raises(ToolRefused, match="more than 2 entries"):
        unpack(three, str(tmp_path), UnpackLimits(max_members=2))


def test_an_artifact_that_is_not_a_tarball_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolRefused, match=r"not a valid \.tar\.gz"):
        unpack(io.BytesIO(b"\x1f\x8b but not gzip at all"), str(tmp_path), UnpackLimits())


def test_an_installed_sha_is_not_unpacked_again(tmp_path: Path) -> None:
    (tmp_path / SHA).mkdir()
    install(str(tmp_path), SHA, io.BytesIO(b"never read"), UnpackLimits())
    assert os.listdir(tmp_path / SHA) == []
    assert not (tmp_path / TEMP).exists()


class InstalledMeanwhile(io.BytesIO):
    """An artifact whose first read lets another install of the same sha finish first."""

    def __init__(self, data: bytes, final: Path) -> None:
        super().__init__(data)
        self.final = final

    def read(self, size: int | None = -1) -> bytes:
        if not self.final.exists():
            self.final.mkdir()
            (self.final / "theirs").write_bytes(b"")  # a whole tool: rename cannot replace it
        return super().read(size)


def test_an_install_that_loses_the_race_keeps_the_winners_tool(tmp_path: Path) -> None:
    final = tmp_path / SHA
    artifact: IO[bytes] = InstalledMeanwhile(archive(("mine", tarfile.REGTYPE, "x")).read(), final)
    install(str(tmp_path), SHA, artifact, UnpackLimits())
    assert os.listdir(final) == ["theirs"]
    assert os.listdir(tmp_path / TEMP) == []


def test_an_install_whose_place_is_not_a_directory_fails_and_cleans_up(tmp_path: Path) -> None:
    final = tmp_path / SHA

    class FileMeanwhile(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            final.touch(exist_ok=True)
            return super().read(size)

    artifact = FileMeanwhile(archive(("mine", tarfile.REGTYPE, "x")).read())
    with pytest.raises(NotADirectoryError):
        install(str(tmp_path), SHA, artifact, UnpackLimits())
    assert final.is_file()
    assert os.listdir(tmp_path / TEMP) == []
