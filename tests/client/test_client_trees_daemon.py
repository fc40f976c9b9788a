"""Directory trees through a real daemon as tar streams (``files.tree``): ``sandboxctl put/get``
(its own process) and ``HttpSandbox.upload_tree/download_tree``, byte- and mode-exact, with
the daemon's memory flat; and hostile archives refused with nothing landing outside."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted

from sandboxd_client import HttpSandbox
from tests.support.coverage import coverage_env

from .real_daemon import Daemon, daemon_and_client

REPO = str(Path(__file__).resolve().parents[2])
TOKEN = "trees-daemon-token"
MIB = 1 << 20
RSS_GROWTH_MAX = 50 * MIB

daemon, client = daemon_and_client(TOKEN)


@pytest.fixture
def ctl(daemon: Daemon, tmp_path: Path) -> Iterator[object]:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {
        **coverage_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": REPO,
        "SANDBOXD_URL": daemon.url,
        "SANDBOXD_TOKEN_FILE": str(token),
    }

    def run(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", *argv],
            env=env,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,  # not the test's own
            capture_output=True,
            timeout=600,
            check=False,
        )

    yield run


def rss(pid: int) -> int:
    """The process's resident memory, from ``/proc``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def make_tree(root: Path, big: int, small: int) -> None:
    """A symlink (relative and absolute), an executable, an empty directory, a file of
    ``big`` MiB of real bytes and ``small`` small files."""
    (root / "bin").mkdir(parents=True)
    gradlew = root / "bin" / "gradlew"
    gradlew.write_bytes(b"#!/bin/sh\necho built\n")
    gradlew.chmod(0o755)
    (root / "bin" / "run").symlink_to("gradlew")
    (root / "abs-link").symlink_to("/etc/hostname")
    (root / "empty" / "deeper").mkdir(parents=True)
    (root / "private").mkdir(mode=0o700)
    (root / "private").chmod(0o700)
    with open(root / "big.bin", "wb") as f:
        for _ in range(big):
            f.write(os.urandom(MIB))
    for i in range(small):
        d = root / "many" / f"{i // 100:03}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(b"%d\n" % i * (i % 7))


def snapshot(root: Path) -> dict[str, tuple[str, int, object]]:
    """Relative path → (kind, mode, content digest / link target / mtime)."""
    found: dict[str, tuple[str, int, object]] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", mode, None)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[rel] = ("file", mode, (digest, int(st.st_mtime)))
    return found


def test_sandboxctl_round_trips_a_big_tree_exactly_with_the_daemon_flat(
    ctl,
    daemon: Daemon,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    source = tmp_path / "src"
    make_tree(source, big=200, small=10_000)
    handle = ctl("create").stdout.decode().strip()
    before = rss(daemon.pid)
    done = ctl("put", handle, str(source), "/project")
    assert done.returncode == 0, done.stderr
    grown_put = rss(daemon.pid) - before
    back = tmp_path / "back"
    done = ctl("get", handle, "/project", str(back))
    assert done.returncode == 0, done.stderr
    grown = rss(daemon.pid) - before
    assert grown_put < RSS_GROWTH_MAX and grown < RSS_GROWTH_MAX, (grown_put, grown)
    assert snapshot(back) == snapshot(source)
    done = ctl("exec", handle, "--cwd", "project", "./bin/run")
    assert (done.returncode, done.stdout) == (0, b"built\n")
    assert ctl("kill", handle).returncode == 0


def test_dash_is_a_tar_on_stdin_and_stdout(ctl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "src"
    make_tree(source, big=1, small=20)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(source, arcname=".")
    handle = ctl("create").stdout.decode().strip()
    done = ctl("put", handle, "-", "/in", stdin=buffer.getvalue())
    assert done.returncode == 0, done.stderr
    assert not (Path.cwd() / "-").exists()
    done = ctl("get", handle, "/in", "-")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r|") as archive:
        archive.extractall(out, filter="fully_trusted")
    assert snapshot(out) == snapshot(source)
    done = ctl("get", handle, "/in/bin/gradlew", str(tmp_path / "one"))  # a file: as before
    assert (tmp_path / "one").read_bytes() == b"#!/bin/sh\necho built\n"
    done = ctl("get", handle, "/missing", str(tmp_path / "none"))
    assert done.returncode == 1 and b"FileNotFoundError" in done.stderr
    assert ctl("kill", handle).returncode == 0


@pytest_twisted.ensureDeferred
async def test_the_client_round_trips_a_tree(client: HttpSandbox, tmp_path: Path) -> None:
    source = tmp_path / "src"
    make_tree(source, big=8, small=1000)
    handle = await client.create()
    assert "files.tree" in await client.capabilities(handle)
    await client.upload_tree(handle, "/t", str(source))
    written = await client.download_tree(handle, "/t", str(tmp_path / "back"))
    assert snapshot(tmp_path / "back") == snapshot(source)
    assert written == len(snapshot(source))
    sink = io.BytesIO()
    await client.download_tar(handle, "/t/bin", sink)
    with tarfile.open(fileobj=io.BytesIO(sink.getvalue()), mode="r|") as archive:
        assert sorted(m.name for m in archive) == ["gradlew", "run"]
    await client.kill(handle)


def hostile(name: str, kind: bytes, link: str = "", data: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        if kind == tarfile.REGTYPE and "/" in name and link:
            first = tarfile.TarInfo(name.split("/")[0])
            first.type, first.linkname = tarfile.SYMTYPE, link
            archive.addfile(first)
            kind, link = tarfile.REGTYPE, ""
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(data)
        archive.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


@pytest_twisted.ensureDeferred
async def test_hostile_archives_are_refused_and_nothing_lands_outside(
    client: HttpSandbox, daemon: Daemon, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    handle = await client.create()
    cases = {
        "../x": hostile("../x", tarfile.REGTYPE, data=b"evil"),
        "'esc/payload': a symlink": hostile(
            "esc/payload", tarfile.REGTYPE, link=str(outside), data=b"evil"
        ),
        "'hard': a hard link": hostile("hard", tarfile.LNKTYPE, link="/etc/passwd"),
        "'null': a device": hostile("null", tarfile.CHRTYPE),
        "'/abs': an absolute": hostile("/abs", tarfile.REGTYPE, data=b"evil"),
    }
    for says, body in cases.items():
        with pytest.raises(ValueError, match=says):
            await client.upload_tar(handle, "/in", io.BytesIO(body))
    assert list(outside.iterdir()) == []
    for root in (daemon.root, daemon.root.parent):
        assert not (root / "x").exists() and not (root / "abs").exists()
    await client.kill(handle)
