"""Paths that try to leave the workspace (docs/isolation.rst, "File operations"): ``..``, NUL,
symlinks, hardlinks.

Each answer is a ``400`` or a ``404``, never the outside file's bytes, and nothing outside the
workspace is read, written, renamed or removed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import pytest_twisted

from tests.http.http_harness import Harness

SECRET = b"the outside file's secret bytes"


@pytest.fixture
def rid(harness: Harness) -> str:
    return harness.create()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every workspace, with a file in it."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret").write_bytes(SECRET)
    return directory


def snapshot(directory: Path) -> dict[str, tuple[bytes | None, int]]:
    """Names, contents and inode numbers of everything under ``directory``."""
    seen: dict[str, tuple[bytes | None, int]] = {}
    for path in sorted(directory.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        seen[str(path.relative_to(directory))] = (data, st.st_ino)
    return seen


@pytest.fixture
def links(harness: Harness, rid: str, outside: Path) -> Path:
    """In the workspace: ``file-link`` → the outside file, ``dir-link`` → the outside dir."""
    ws = Path(harness.workspace(rid))
    (ws / "file-link").symlink_to(outside / "secret")
    (ws / "dir-link").symlink_to(outside)
    (ws / "real").mkdir()
    (ws / "real" / "up-link").symlink_to("../../../../outside/secret")
    return ws


ESCAPING = ["..", "../x", "/..", "a/../../x", "/a/b/../../../etc/passwd", "./../x"]


@pytest.mark.parametrize("path", ESCAPING)
@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("PUT", "file"),
        ("GET", "file"),
        ("DELETE", "file"),
        ("GET", "exists"),
        ("GET", "size"),
        ("GET", "walk"),
        ("DELETE", "dir"),
    ],
)
def test_dotdot_escapes_are_400(
    harness: Harness, rid: str, method: str, route: str, path: str
) -> None:
    name = "root" if route == "walk" else "path"
    reply = harness.call(method, f"/sandboxes/{rid}/{route}", params={name: path}, data=b"x")
    status, kind = reply.error()
    assert (status, kind) == (400, "BadRequest")
    assert "escapes" in reply.json()["detail"]


@pytest.mark.parametrize("path", ESCAPING)
def test_dotdot_escapes_in_bodies_are_400(harness: Harness, rid: str, path: str) -> None:
    for route, body in [
        ("mkdir", {"path": path}),
        ("rename", {"src": path, "dst": "x"}),
        ("rename", {"src": "x", "dst": path}),
    ]:
        reply = harness.call("POST", f"/sandboxes/{rid}/{route}", json_body=body)
        assert reply.error() == (400, "BadRequest"), (route, body)


@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("PUT", "file"),
        ("GET", "file"),
        ("DELETE", "file"),
        ("GET", "exists"),
        ("GET", "size"),
        ("GET", "walk"),
        ("DELETE", "dir"),
    ],
)
def test_nul_in_a_path_is_400(harness: Harness, rid: str, method: str, route: str) -> None:
    name = "root" if route == "walk" else "path"
    reply = harness.call(method, f"/sandboxes/{rid}/{route}?{name}=a%00b", data=b"x")
    status, kind = reply.error()
    assert (status, kind) == (400, "BadRequest")
    assert "NUL" in reply.json()["detail"]


def test_nul_in_body_paths_is_400(harness: Harness, rid: str) -> None:
    for route, body in [
        ("mkdir", {"path": "a\u0000b"}),
        ("rename", {"src": "a\u0000", "dst": "x"}),
        ("rename", {"src": "x", "dst": "\u0000"}),
    ]:
        reply = harness.call("POST", f"/sandboxes/{rid}/{route}", json_body=body)
        assert reply.error() == (400, "BadRequest")
    assert os.listdir(harness.workspace(rid)) == []


def test_overlong_paths_are_400(harness: Harness, rid: str) -> None:
    for path in ["a" * 256, "a/" * 2048]:
        reply = harness.call("GET", f"/sandboxes/{rid}/exists", params={"path": path})
        assert reply.error() == (400, "BadRequest")


@pytest_twisted.ensureDeferred
async def test_download_never_follows_a_symlink(
    harness: Harness, rid: str, links: Path, outside: Path
) -> None:
    for path in ["file-link", "dir-link/secret", "real/up-link", "/real/../file-link"]:
        reply = await harness.acall("GET", f"/sandboxes/{rid}/file", params={"path": path})
        assert reply.status in (400, 404), path
        assert SECRET not in reply.body
        reply.error()


def test_probes_never_follow_a_symlink(harness: Harness, rid: str, links: Path) -> None:
    for path in ["file-link", "dir-link", "dir-link/secret", "real/up-link"]:
        exists = harness.call("GET", f"/sandboxes/{rid}/exists", params={"path": path})
        assert exists.json() == {"exists": False}, path
        size = harness.call("GET", f"/sandboxes/{rid}/size", params={"path": path})
        assert size.json() == {"size": None}, path
    assert harness.call("GET", f"/sandboxes/{rid}/disk-usage").json() == {"bytes": 0}


def test_walk_never_follows_a_symlink(harness: Harness, rid: str, links: Path) -> None:
    for root in ["/", "dir-link", "file-link", "real", "dir-link/"]:
        reply = harness.call("GET", f"/sandboxes/{rid}/walk", params={"root": root})
        assert reply.json() == {"entries": []}, root


def test_upload_through_or_onto_a_symlink_never_writes_outside(
    harness: Harness, rid: str, links: Path, outside: Path
) -> None:
    before = snapshot(outside)
    reply = harness.call(
        "PUT", f"/sandboxes/{rid}/file", params={"path": "dir-link/secret"}, data=b"pwned"
    )
    assert reply.status in (400, 404)
    reply.error()
    reply = harness.call(
        "PUT", f"/sandboxes/{rid}/file", params={"path": "dir-link/new/file"}, data=b"pwned"
    )
    assert reply.status in (400, 404)
    # Onto a link: the link itself is replaced by a regular file inside the workspace.
    reply = harness.call(
        "PUT", f"/sandboxes/{rid}/file", params={"path": "file-link"}, data=b"mine"
    )
    assert reply.status == 204
    assert not (links / "file-link").is_symlink()
    assert (links / "file-link").read_bytes() == b"mine"
    assert snapshot(outside) == before


def test_delete_rmdir_mkdir_never_touch_outside(
    harness: Harness, rid: str, links: Path, outside: Path
) -> None:
    before = snapshot(outside)
    calls = [
        ("DELETE", "file", "dir-link/secret"),
        ("DELETE", "dir", "dir-link"),
        ("DELETE", "dir", "file-link"),
        ("DELETE", "dir", "dir-link/"),
    ]
    for method, route, path in calls:
        reply = harness.call(method, f"/sandboxes/{rid}/{route}", params={"path": path})
        assert reply.status in (400, 404), (method, route, path)
        reply.error()
    for path in ["dir-link/made", "dir-link", "file-link/x"]:
        reply = harness.call("POST", f"/sandboxes/{rid}/mkdir", json_body={"path": path})
        assert reply.status in (400, 404), path
    # Deleting a link removes the link, not what it points at.
    reply = harness.call("DELETE", f"/sandboxes/{rid}/file", params={"path": "file-link"})
    assert reply.status == 204
    assert not os.path.lexists(links / "file-link")
    assert snapshot(outside) == before


def test_rename_never_touches_outside(
    harness: Harness, rid: str, links: Path, outside: Path
) -> None:
    (links / "mine").write_bytes(b"mine")
    before = snapshot(outside)
    for body in [
        {"src": "dir-link/secret", "dst": "stolen"},
        {"src": "mine", "dst": "dir-link/secret"},
        {"src": "mine", "dst": "dir-link/new/secret"},
    ]:
        reply = harness.call("POST", f"/sandboxes/{rid}/rename", json_body=body)
        assert reply.status in (400, 404), body
        reply.error()
    # Renaming onto a link replaces the link; renaming a link moves the link.
    body = {"src": "mine", "dst": "file-link"}
    assert harness.call("POST", f"/sandboxes/{rid}/rename", json_body=body).status == 204
    assert (links / "file-link").read_bytes() == b"mine"
    body = {"src": "dir-link", "dst": "moved-link"}
    assert harness.call("POST", f"/sandboxes/{rid}/rename", json_body=body).status == 204
    assert (links / "moved-link").is_symlink()
    assert not os.path.lexists(links / "stolen")
    assert snapshot(outside) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file another owner")
@pytest_twisted.ensureDeferred
async def test_a_hardlink_to_a_foreign_file_is_refused(
    harness: Harness, rid: str, outside: Path
) -> None:
    secret = outside / "secret"
    os.chown(secret, 4242, 4242)  # owned by someone other than the sandbox
    os.link(secret, Path(harness.workspace(rid)) / "hard")
    reply = await harness.acall("GET", f"/sandboxes/{rid}/file", params={"path": "hard"})
    assert reply.error() == (400, "BadRequest")
    assert SECRET not in reply.body
    assert secret.read_bytes() == SECRET
