"""The archive through a real ``twistd -n sandboxd`` (``--isolation=none``) over real TCP."""

from __future__ import annotations

import os
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.archive.archive_helpers import tree
from tests.support.daemon import (
    Daemon,
    daemon_argv,
    daemon_environ,
    start_daemon,
    stop_daemon,
)


@pytest.fixture
def archived(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(
        tmp_path,
        "--isolation=none",
        f"--archive-root={tmp_path / 'archive'}",
        f"--tools-dir={tmp_path / 'tools'}",
    )
    try:
        yield running
    finally:
        stop_daemon(running)


def archive_of(daemon: Daemon) -> Path:
    return daemon.log.parent / "archive"


def create(daemon: Daemon, **body: object) -> str:
    return str(daemon.json("POST", "/sandboxes", body)["remote_id"])


def put(daemon: Daemon, rid: str, path: str, data: bytes) -> None:
    quoted = urllib.parse.quote(path)
    status, body = daemon.call("PUT", f"/sandboxes/{rid}/file?path={quoted}", raw=data)
    assert status == 204, body


def get(daemon: Daemon, rid: str, path: str) -> bytes:
    status, body = daemon.call("GET", f"/sandboxes/{rid}/file?path={urllib.parse.quote(path)}")
    assert status == 200, body
    return body


def persist(daemon: Daemon, rid: str, delete: bool) -> None:
    status, body = daemon.call("POST", f"/sandboxes/{rid}/persist", {"delete": delete})
    assert (status, body) == (204, b"")


def test_an_item_survives_kill_and_recreate_byte_for_byte(archived: Daemon) -> None:
    files = {
        "notes.md": b"# notes\n",
        "src/main.py": b"print('hi')\n",
        "data/blob.bin": os.urandom(5 << 20),
        "deep/a/b/c/d.txt": b"deep",
    }
    rid = create(archived, item_id="conversation-42")
    assert archived.json("GET", f"/sandboxes/{rid}/ready") == {"ready": True}
    for path, data in files.items():
        put(archived, rid, path, data)
    persist(archived, rid, delete=True)
    assert archived.call("DELETE", f"/sandboxes/{rid}")[0] == 204

    again = create(archived, item_id="conversation-42")
    assert archived.json("GET", f"/sandboxes/{again}/ready") == {"ready": True}
    walked = archived.json("GET", f"/sandboxes/{again}/walk")["entries"]
    assert sorted(e["path"] for e in walked) == sorted("/" + p for p in files)
    for path, data in files.items():
        assert get(archived, again, path) == data


def test_a_new_item_gives_an_empty_ready_workspace(archived: Daemon) -> None:
    rid = create(archived, item_id="brand-new")
    assert archived.json("GET", f"/sandboxes/{rid}/ready") == {"ready": True}
    assert archived.json("GET", f"/sandboxes/{rid}/walk") == {"entries": []}


def test_checkpoint_keeps_deleted_files_and_reconcile_removes_them(archived: Daemon) -> None:
    rid = create(archived, item_id="item")
    put(archived, rid, "keep", b"1")
    put(archived, rid, "gone", b"2")
    persist(archived, rid, delete=False)
    assert archived.call("DELETE", f"/sandboxes/{rid}/file?path=gone")[0] == 204
    persist(archived, rid, delete=False)
    assert tree(archive_of(archived) / "item") == {"keep": ("file", b"1"), "gone": ("file", b"2")}
    persist(archived, rid, delete=True)
    assert tree(archive_of(archived) / "item") == {"keep": ("file", b"1")}


def test_persist_of_a_sandbox_that_is_not_ready_changes_nothing(archived: Daemon) -> None:
    rid = create(archived, item_id="item")
    put(archived, rid, "v", b"first")
    persist(archived, rid, delete=True)
    # What a half-restored sandbox looks like: no ready marker (only the daemon can remove it).
    (archived.root / rid / ".ready").unlink()
    assert archived.json("GET", f"/sandboxes/{rid}/ready") == {"ready": False}
    put(archived, rid, "v", b"second")
    put(archived, rid, "w", b"new")
    persist(archived, rid, delete=True)
    assert tree(archive_of(archived) / "item") == {"v": ("file", b"first")}


def test_without_item_id_create_and_persist_behave_as_before(archived: Daemon) -> None:
    rid = create(archived)
    assert archived.json("GET", f"/sandboxes/{rid}/ready") == {"ready": False}
    put(archived, rid, "f", b"x")
    assert archived.call("POST", f"/sandboxes/{rid}/mark-ready")[0] == 204
    persist(archived, rid, delete=True)
    assert os.listdir(archive_of(archived)) == [".sandboxd-staging"]


BAD_ITEM_IDS = ["a/b", "..", ".", "", "x\u0000y", "é" * 200, ".sandboxd-staging", 42, "\ud800"]


def test_bad_item_ids_are_refused(archived: Daemon) -> None:
    for item_id in BAD_ITEM_IDS:
        status, body = archived.call("POST", "/sandboxes", {"item_id": item_id})
        assert status == 400, (item_id, body)
        assert b"BadRequest" in body
    assert archived.json("GET", "/sandboxes")["sandboxes"] == []
    assert create(archived, item_id="é" * 127) != ""


def test_persist_answers_400_for_a_non_boolean_delete(archived: Daemon) -> None:
    rid = create(archived, item_id="item")
    status, body = archived.call("POST", f"/sandboxes/{rid}/persist", {"delete": "yes"})
    assert status == 400, body


def test_a_failed_persist_is_a_500_with_the_error_json(archived: Daemon) -> None:
    """The archive entry replaced by a file: the copy cannot install, the answer says why."""
    rid = create(archived, item_id="item")
    put(archived, rid, "f", b"x")
    persist(archived, rid, delete=True)
    entry = archive_of(archived) / "item"
    (entry / "f").unlink()
    entry.rmdir()
    entry.write_bytes(b"not a directory")
    status, body = archived.call("POST", f"/sandboxes/{rid}/persist", {"delete": False})
    assert status == 500
    assert b'"error": "ArchiveError"' in body
    assert entry.read_bytes() == b"not a directory"


def test_healthz_lists_archive_only_when_configured(archived: Daemon, tmp_path: Path) -> None:
    assert "archive" in archived.json("GET", "/healthz")["capabilities"]
    (tmp_path / "plain").mkdir()
    plain = start_daemon(tmp_path / "plain", "--isolation=none")
    try:
        assert "archive" not in plain.json("GET", "/healthz")["capabilities"]
        rid = create(plain, item_id="item")
        assert plain.json("GET", f"/sandboxes/{rid}/ready") == {"ready": False}
        assert plain.call("POST", f"/sandboxes/{rid}/persist", {"delete": True})[0] == 204
    finally:
        stop_daemon(plain)


def test_startup_fails_loudly_when_the_archive_cannot_be_used(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    result = subprocess.run(
        daemon_argv(
            "--isolation=none",
            f"--root={tmp_path / 'root'}",
            f"--archive-root={tmp_path / 'file' / 'archive'}",
            "--listen=tcp:0:interface=127.0.0.1",
        ),
        capture_output=True,
        env=daemon_environ(),
        timeout=60,
    )
    assert result.returncode != 0
    output = (result.stdout + result.stderr).decode()
    assert "start-up failed at archive" in output
