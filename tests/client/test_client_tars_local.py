"""The client's own side of tar streams (``_tars``): what ``download_tree`` unpacks from a
service that sends a hostile or broken archive (a real HTTP server on 127.0.0.1 answering the
tree route with the test's bytes) is refused by name with nothing written outside LOCAL and
no partial file left; and what ``pack`` makes of a local tree."""

from __future__ import annotations

import io
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted

from sandboxd_client import HttpSandbox, SandboxHandle, encode_handle
from sandboxd_client._tars import PackReader, pack

from .client_hostile import Hostile, respond
from .servers import listen, make_client, url_of

TAR = "application/x-tar"


class Service:
    """A service whose tree route answers what the test scripts."""

    def __init__(self) -> None:
        self.server = Hostile()
        self.port = listen(self.server.app.resource())
        self.client: HttpSandbox = make_client(url_of(self.port))
        self.handle: SandboxHandle = encode_handle(url_of(self.port), "sb-1")

    async def download(self, archive: bytes, local: Path) -> int:
        self.server.on("GET tree", respond(200, archive, TAR))
        return await self.client.download_tree(self.handle, "/t", str(local))


@pytest.fixture
def service() -> Iterator[Service]:
    s = Service()
    yield s
    pytest_twisted.blockon(s.client.close())
    pytest_twisted.blockon(s.port.stopListening())


def member(
    name: str,
    kind: bytes = tarfile.REGTYPE,
    data: bytes = b"",
    link: str = "",
    mode: int | None = None,
) -> tuple:  # type: ignore[type-arg]
    """One member; ``mode`` defaults to 0755 for a directory, 0644 for anything else."""
    return (name, kind, data, link, mode)


def archive(*members: tuple) -> bytes:  # type: ignore[type-arg]
    """A tar of ``members`` as written, in order (``name, type, data, link name, mode``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data, link, mode in members:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.linkname = kind, len(data), link
            info.mode = mode if mode is not None else 0o755 if kind == tarfile.DIRTYPE else 0o644
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


REFUSED = {
    "absolute": (archive(member("/abs", data=b"evil")), "member '/abs': an absolute name"),
    "dot-dot": (archive(member("a/../../x", data=b"evil")), "member 'a/../../x': a '..'"),
    "hard link": (
        archive(member("hard", tarfile.LNKTYPE, link="/etc/passwd")),
        "member 'hard': a hard link",
    ),
    "device": (archive(member("null", tarfile.CHRTYPE)), "member 'null': a device, FIFO"),
    "fifo": (archive(member("pipe", tarfile.FIFOTYPE)), "member 'pipe': a device, FIFO"),
    "through a symlink": (
        archive(member("esc", tarfile.SYMTYPE, link="/etc"), member("esc/passwd", data=b"x")),
        "member 'esc/passwd': a symlink or a file is in its way",
    ),
    "through a file": (
        archive(member("f", data=b"file"), member("f/inner", data=b"x")),
        "member 'f/inner': a symlink or a file is in its way",
    ),
    "directory over a file": (
        archive(member("f", data=b"file"), member("f", tarfile.DIRTYPE)),
        "member 'f': a file or symlink is in its way",
    ),
    "file over a directory": (
        archive(member("d", tarfile.DIRTYPE), member("d", data=b"x")),
        "member 'd': a directory is in its way",
    ),
}


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("case", list(REFUSED))
async def test_a_hostile_member_is_refused_and_nothing_lands_outside(
    service: Service, tmp_path: Path, case: str
) -> None:
    body, says = REFUSED[case]
    local = tmp_path / "local"
    with pytest.raises(ValueError, match=f"^{re.escape(says)}"):
        await service.download(body, local)
    found = everything(tmp_path)
    assert all(name.startswith("local") for name in found), found
    assert not any(name.endswith(".part") for name in found), "no partial file"
    assert os.path.getsize("/etc/passwd") > 0 and not os.path.islink("/etc/passwd")


@pytest_twisted.ensureDeferred
async def test_parents_are_made_and_dot_is_the_destination(
    service: Service, tmp_path: Path
) -> None:
    body = archive(
        member("./", tarfile.DIRTYPE),
        member("deep/er/file.txt", data=b"deep"),
        member("deep/link", tarfile.SYMTYPE, link="er/file.txt"),
    )
    written = await service.download(body, tmp_path / "local")
    assert written == 2, "the destination itself is not a member written"
    local = tmp_path / "local"
    assert everything(local) == ["deep", "deep/er", "deep/er/file.txt", "deep/link"]
    assert (local / "deep" / "link").read_bytes() == b"deep"
    assert os.readlink(local / "deep" / "link") == "er/file.txt"


@pytest_twisted.ensureDeferred
async def test_a_directory_listed_after_its_files_keeps_them_and_takes_its_mode(
    service: Service, tmp_path: Path
) -> None:
    """A directory member whose directory the way to an earlier member already made (tars
    written in another order than ours): its files stay, its mode is the member's (0750, not
    the 0755 the umask gives the directory made on the way)."""
    body = archive(member("d/x.txt", data=b"x"), member("d", tarfile.DIRTYPE, mode=0o750))
    await service.download(body, tmp_path / "local")
    local = tmp_path / "local"
    assert everything(local) == ["d", "d/x.txt"]
    assert (local / "d" / "x.txt").read_bytes() == b"x"
    assert stat.S_IMODE((local / "d").stat().st_mode) == 0o750


@pytest_twisted.ensureDeferred
async def test_a_cut_stream_is_not_a_tar_and_leaves_no_partial_file(
    service: Service, tmp_path: Path
) -> None:
    whole = archive(member("kept", data=b"k"), member("big", data=b"b" * 100_000))
    cut = whole[: 3 * tarfile.BLOCKSIZE + 50_000]  # kept's header and data, big's header, half
    local = tmp_path / "local"
    with pytest.raises(ValueError, match=r"^not a tar stream"):
        await service.download(cut, local)
    assert everything(local) == ["kept"], "the member before the cut, and no .part file"
    with pytest.raises(ValueError, match=r"^not a tar stream"):
        await service.download(b"<html>not a tar</html>" * 100, tmp_path / "other")


def test_pack_leaves_out_what_is_not_a_file_a_directory_or_a_link(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_bytes(b"a")
    os.mkfifo(root / "fifo")
    (root / "z").symlink_to("a.txt")
    with tarfile.open(fileobj=io.BytesIO(b"".join(pack(str(root)))), mode="r|") as tar:
        assert [(m.name, m.type) for m in tar] == [
            ("a.txt", tarfile.REGTYPE),
            ("z", tarfile.SYMTYPE),
        ]


def test_a_pack_reader_read_without_a_size_gives_a_whole_part(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    parts = list(pack(str(tmp_path)))
    reader = PackReader(iter(parts))
    assert reader.read(5) == parts[0][:5]
    assert reader.read() == parts[0][5:], "the rest of the part"
    assert reader.read() == b"", "the end"
    reader.close()
    assert reader.closed
