"""The file routes: success shapes, error bodies and the bad input of
docs/contract.rst, "Bad input and faults".

Downloads stream through twisted.web's ``FileSender``, whose pull-to-push adapter runs on the
global cooperator, so those tests run the real reactor (pytest-twisted); the rest answer within
one in-memory flush.
"""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import pytest_twisted
from twisted.web.client import ResponseFailed

from sandboxd.http.routes import files as file_routes
from tests.http.http_harness import Harness


def put(h: Harness, rid: str, path: str, data: bytes) -> None:
    reply = h.call("PUT", f"/sandboxes/{rid}/file", params={"path": path}, data=data)
    assert (reply.status, reply.body) == (204, b""), reply


def walk(h: Harness, rid: str, root: str | None = None) -> dict[str, dict[str, object]]:
    params = None if root is None else {"root": root}
    reply = h.call("GET", f"/sandboxes/{rid}/walk", params=params)
    assert reply.status == 200
    entries = reply.json()["entries"]
    return {e["path"]: e for e in entries}


@pytest.fixture
def rid(harness: Harness) -> str:
    return harness.create()


# Upload and download


@pytest_twisted.ensureDeferred
async def test_upload_then_download_round_trips(harness: Harness, rid: str) -> None:
    data = bytes(range(256)) * 300
    put(harness, rid, "/dir/sub/blob.bin", data)
    reply = await harness.acall(
        "GET", f"/sandboxes/{rid}/file", params={"path": "dir/sub/blob.bin"}
    )
    assert reply.status == 200
    assert reply.header("content-type") == "application/octet-stream"
    assert reply.body == data
    assert reply.length == len(data)
    with open(os.path.join(harness.workspace(rid), "dir", "sub", "blob.bin"), "rb") as f:
        assert f.read() == data


@pytest_twisted.ensureDeferred
async def test_download_of_an_empty_file(harness: Harness, rid: str) -> None:
    put(harness, rid, "empty", b"")
    reply = await harness.acall("GET", f"/sandboxes/{rid}/file", params={"path": "empty"})
    assert (reply.status, reply.body) == (200, b"")


def test_upload_replaces_and_leaves_no_temporary_file(harness: Harness, rid: str) -> None:
    put(harness, rid, "f", b"first version")
    put(harness, rid, "f", b"second")
    with open(os.path.join(harness.workspace(rid), "f"), "rb") as f:
        assert f.read() == b"second"
    assert os.listdir(harness.workspace(rid)) == ["f"]


@pytest.mark.parametrize("path", ["/", "", "a/.."])
def test_upload_to_the_root_is_400(harness: Harness, rid: str, path: str) -> None:
    reply = harness.call("PUT", f"/sandboxes/{rid}/file", params={"path": path}, data=b"x")
    assert reply.error() == (400, "BadRequest")


def test_upload_over_a_directory_is_400(harness: Harness, rid: str) -> None:
    harness.call("POST", f"/sandboxes/{rid}/mkdir", json_body={"path": "d"})
    reply = harness.call("PUT", f"/sandboxes/{rid}/file", params={"path": "d"}, data=b"x")
    assert reply.error() == (400, "BadRequest")
    assert os.path.isdir(os.path.join(harness.workspace(rid), "d"))


def test_upload_without_path_is_400(harness: Harness, rid: str) -> None:
    reply = harness.call("PUT", f"/sandboxes/{rid}/file", data=b"x")
    status, kind = reply.error()
    assert (status, kind) == (400, "BadRequest")
    assert "path" in reply.json()["detail"]


def test_upload_when_the_disk_is_full_is_507_and_leaves_nothing(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(source: object, target: object, length: int = 0) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", full)  # the one workspace copies with
    reply = harness.call("PUT", f"/sandboxes/{rid}/file", params={"path": "a/big"}, data=b"x" * 10)
    assert reply.error() == (507, "InsufficientStorage")
    monkeypatch.undo()
    assert os.listdir(os.path.join(harness.workspace(rid), "a")) == []


class TestBodyLimit:
    @pytest.fixture
    def settings(self, settings: dict[str, str]) -> dict[str, str]:
        return {**settings, "max-body": "10"}

    def test_an_upload_over_the_limit_is_413_and_writes_nothing(
        self, harness: Harness, rid: str
    ) -> None:
        reply = harness.call("PUT", f"/sandboxes/{rid}/file", params={"path": "f"}, data=b"x" * 11)
        assert reply.error() == (413, "TooLarge")
        assert os.listdir(harness.workspace(rid)) == []
        put(harness, rid, "f", b"x" * 10)


@pytest_twisted.ensureDeferred
async def test_download_of_a_missing_file_is_404(harness: Harness, rid: str) -> None:
    for path in ("nope", "no/such/dir/file"):
        reply = await harness.acall("GET", f"/sandboxes/{rid}/file", params={"path": path})
        assert reply.error() == (404, "FileNotFoundError")


@pytest_twisted.ensureDeferred
async def test_download_of_a_directory_or_fifo_is_400(harness: Harness, rid: str) -> None:
    os.mkdir(os.path.join(harness.workspace(rid), "d"))
    os.mkfifo(os.path.join(harness.workspace(rid), "fifo"))
    for path in ("/", "d", "fifo"):
        reply = await harness.acall("GET", f"/sandboxes/{rid}/file", params={"path": path})
        assert reply.error() == (400, "BadRequest"), path


# Probes


def test_exists(harness: Harness, rid: str) -> None:
    put(harness, rid, "a/b", b"x")

    def exists(path: str) -> bool:
        reply = harness.call("GET", f"/sandboxes/{rid}/exists", params={"path": path})
        assert reply.status == 200
        body = reply.json()
        assert set(body) == {"exists"}
        return bool(body["exists"])

    assert exists("a/b") and exists("/a/b") and exists("a") and exists("/")
    assert not exists("a/c") and not exists("c/d") and not exists("a/b/c")


def test_size(harness: Harness, rid: str) -> None:
    put(harness, rid, "a/b", b"12345")

    def size(path: str) -> object:
        reply = harness.call("GET", f"/sandboxes/{rid}/size", params={"path": path})
        assert reply.status == 200
        return reply.json()["size"]

    assert size("a/b") == 5
    assert size("a") is None
    assert size("/") is None
    assert size("missing") is None


def test_disk_usage(harness: Harness, rid: str) -> None:
    assert harness.call("GET", f"/sandboxes/{rid}/disk-usage").json() == {"bytes": 0}
    put(harness, rid, "a/b", b"12345")
    put(harness, rid, "c", b"123")
    assert harness.call("GET", f"/sandboxes/{rid}/disk-usage").json() == {"bytes": 8}


def test_walk_lists_every_regular_file_with_rooted_paths(harness: Harness, rid: str) -> None:
    put(harness, rid, "top", b"1")
    put(harness, rid, "d/e/deep", b"22")
    harness.call("POST", f"/sandboxes/{rid}/mkdir", json_body={"path": "empty/dir"})
    harness.call("POST", f"/sandboxes/{rid}/mark-ready")
    # home/ and tmp/ of the sandbox hold files too; they never show.
    with open(os.path.join(harness.manager.layout.home(rid), "dotfile"), "w") as f:
        f.write("x")
    with open(os.path.join(harness.manager.layout.tmp(rid), "scratch"), "w") as f:
        f.write("x")
    entries = walk(harness, rid)
    assert set(entries) == {"/top", "/d/e/deep"}
    assert entries["/d/e/deep"]["size"] == 2
    assert all(isinstance(e["version"], str) and e["version"] for e in entries.values())
    assert set(walk(harness, rid, "/d")) == {"/d/e/deep"}
    assert set(walk(harness, rid, "d/e/")) == {"/d/e/deep"}
    assert set(walk(harness, rid, "top")) == {"/top"}
    assert walk(harness, rid, "missing") == {}
    assert walk(harness, rid, "empty") == {}


def test_walk_version_changes_with_content(harness: Harness, rid: str) -> None:
    put(harness, rid, "f", b"aaaa")
    before = walk(harness, rid)["/f"]["version"]
    assert walk(harness, rid)["/f"]["version"] == before
    put(harness, rid, "f", b"bbbb")
    assert walk(harness, rid)["/f"]["version"] != before


# Changes


def test_delete(harness: Harness, rid: str) -> None:
    put(harness, rid, "a/b", b"x")
    reply = harness.call("DELETE", f"/sandboxes/{rid}/file", params={"path": "a/b"})
    assert (reply.status, reply.body) == (204, b"")
    assert os.listdir(os.path.join(harness.workspace(rid), "a")) == []
    again = harness.call("DELETE", f"/sandboxes/{rid}/file", params={"path": "a/b"})
    assert again.error() == (404, "FileNotFoundError")
    assert harness.call("DELETE", f"/sandboxes/{rid}/file", params={"path": "a"}).error() == (
        400,
        "BadRequest",
    )
    assert os.path.isdir(os.path.join(harness.workspace(rid), "a"))


def test_mkdir_is_mkdir_p(harness: Harness, rid: str) -> None:
    for _ in range(2):
        reply = harness.call("POST", f"/sandboxes/{rid}/mkdir", json_body={"path": "x/y/z"})
        assert (reply.status, reply.body) == (204, b"")
    assert os.path.isdir(os.path.join(harness.workspace(rid), "x", "y", "z"))
    assert harness.call("POST", f"/sandboxes/{rid}/mkdir", json_body={"path": "/"}).status == 204


def test_mkdir_over_a_file_is_400(harness: Harness, rid: str) -> None:
    put(harness, rid, "f", b"x")
    reply = harness.call("POST", f"/sandboxes/{rid}/mkdir", json_body={"path": "f"})
    assert reply.error() == (400, "BadRequest")


@pytest.mark.parametrize("body", [{}, {"path": 3}, {"path": None}, {"path": ["a"]}])
def test_mkdir_needs_a_string_path(harness: Harness, rid: str, body: object) -> None:
    reply = harness.call("POST", f"/sandboxes/{rid}/mkdir", json_body=body)
    assert reply.error() == (400, "BadRequest")


def test_rmdir(harness: Harness, rid: str) -> None:
    put(harness, rid, "d/e/f", b"x")
    reply = harness.call("DELETE", f"/sandboxes/{rid}/dir", params={"path": "d"})
    assert (reply.status, reply.body) == (204, b"")
    assert os.listdir(harness.workspace(rid)) == []
    again = harness.call("DELETE", f"/sandboxes/{rid}/dir", params={"path": "d"})
    assert again.error() == (404, "FileNotFoundError")
    put(harness, rid, "file", b"x")
    assert harness.call("DELETE", f"/sandboxes/{rid}/dir", params={"path": "file"}).error() == (
        400,
        "BadRequest",
    )
    assert harness.call("DELETE", f"/sandboxes/{rid}/dir", params={"path": "/"}).error() == (
        400,
        "BadRequest",
    )
    assert os.path.isdir(harness.workspace(rid))


def test_rename_moves_replaces_and_creates_parents(harness: Harness, rid: str) -> None:
    put(harness, rid, "src", b"new")
    put(harness, rid, "deep/dst", b"old")
    reply = harness.call(
        "POST", f"/sandboxes/{rid}/rename", json_body={"src": "src", "dst": "deep/dst"}
    )
    assert (reply.status, reply.body) == (204, b"")
    assert set(walk(harness, rid)) == {"/deep/dst"}
    with open(os.path.join(harness.workspace(rid), "deep", "dst"), "rb") as f:
        assert f.read() == b"new"
    reply = harness.call(
        "POST", f"/sandboxes/{rid}/rename", json_body={"src": "deep", "dst": "n/e/w"}
    )
    assert reply.status == 204
    assert set(walk(harness, rid)) == {"/n/e/w/dst"}


def test_rename_errors(harness: Harness, rid: str) -> None:
    put(harness, rid, "a/b", b"x")

    def rename(body: object) -> tuple[int, str]:
        return harness.call("POST", f"/sandboxes/{rid}/rename", json_body=body).error()

    assert rename({"src": "missing", "dst": "x"}) == (404, "FileNotFoundError")
    assert rename({"src": "nodir/missing", "dst": "x"}) == (404, "FileNotFoundError")
    assert rename({"src": "a", "dst": "a/b/c"}) == (400, "BadRequest")
    assert rename({"src": "a/b", "dst": "a"}) == (400, "BadRequest")
    assert rename({"src": "/", "dst": "x"}) == (400, "BadRequest")
    assert rename({"src": "a", "dst": "/"}) == (400, "BadRequest")
    assert rename({"src": "a"}) == (400, "BadRequest")
    assert rename({"dst": "a"}) == (400, "BadRequest")
    assert rename({"src": 1, "dst": "a"}) == (400, "BadRequest")
    assert set(walk(harness, rid)) == {"/a/b"}


# Ready marker and persist


def test_mark_ready_and_ready(harness: Harness, rid: str) -> None:
    assert harness.call("GET", f"/sandboxes/{rid}/ready").json() == {"ready": False}
    reply = harness.call("POST", f"/sandboxes/{rid}/mark-ready")
    assert (reply.status, reply.body) == (204, b"")
    assert harness.call("GET", f"/sandboxes/{rid}/ready").json() == {"ready": True}
    # The marker is a sibling of the workspace: never inside it, never walked.
    assert walk(harness, rid) == {}
    assert not harness.call("GET", f"/sandboxes/{rid}/exists", params={"path": ".ready"}).json()[
        "exists"
    ]
    assert os.path.isfile(os.path.join(harness.manager.layout.directory(rid), ".ready"))


@pytest.mark.parametrize("body", [None, {}, {"delete": True}, {"delete": False}])
def test_persist_without_archive_is_a_204_no_op(harness: Harness, rid: str, body: object) -> None:
    put(harness, rid, "f", b"x")
    reply = harness.call("POST", f"/sandboxes/{rid}/persist", json_body=body)
    assert (reply.status, reply.body) == (204, b"")
    assert set(walk(harness, rid)) == {"/f"}


@pytest.mark.parametrize("body", [{"delete": "yes"}, {"delete": 1}, {"delete": None}, [1]])
def test_persist_refuses_a_non_boolean_delete(harness: Harness, rid: str, body: object) -> None:
    reply = harness.call("POST", f"/sandboxes/{rid}/persist", json_body=body)
    assert reply.error() == (400, "BadRequest")


# Query parameters


@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("GET", "file"),
        ("DELETE", "file"),
        ("GET", "exists"),
        ("GET", "size"),
        ("DELETE", "dir"),
    ],
)
def test_path_query_must_be_present_and_utf8(
    harness: Harness, rid: str, method: str, route: str
) -> None:
    assert harness.call(method, f"/sandboxes/{rid}/{route}").error() == (400, "BadRequest")
    reply = harness.call(method, f"/sandboxes/{rid}/{route}?path=%ff%fe")
    assert reply.error() == (400, "BadRequest")
    assert "UTF-8" in reply.json()["detail"]


def test_a_boolean_query_parameter_is_true_false_1_or_0(harness: Harness, rid: str) -> None:
    reply = harness.call("GET", f"/sandboxes/{rid}/watch", params={"recursive": "maybe"})
    assert reply.error() == (400, "BadRequest")
    assert reply.json()["detail"] == "recursive: must be true or false"


def test_walk_root_defaults_to_the_workspace(harness: Harness, rid: str) -> None:
    put(harness, rid, "x", b"1")
    assert set(walk(harness, rid)) == set(walk(harness, rid, "/")) == {"/x"}


def sandbox_of_files(request: pytest.FixtureRequest, names: tuple[str, ...]) -> tuple[Harness, str]:
    """A new sandbox of the harness, made under the test's ``settings`` (set before), with a
    one-byte file at each of ``names``."""
    harness: Harness = request.getfixturevalue("harness")
    rid = harness.create()
    for name in names:
        put(harness, rid, name, b"x")
    return harness, rid


def assert_walk_cut_short(harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the walk measured as nothing (the tree grew after), a walk the limits refuse is
    cut short once its status is sent: the answer never ends, so no client takes it whole."""
    monkeypatch.setattr(file_routes, "measure_walk", lambda ws, parts, limit, most: 0)
    with pytest.raises(ResponseFailed) as caught:
        harness.call("GET", f"/sandboxes/{rid}/walk")
    assert "still expecting more data" in str(caught.value.reasons[-1].value)  # never ended


def test_a_walk_past_walk_max_answers_413_naming_it(
    settings: dict[str, str], request: pytest.FixtureRequest
) -> None:
    settings["walk-max"] = "3"
    harness, rid = sandbox_of_files(request, ("a", "b", "c"))
    assert set(walk(harness, rid)) == {"/a", "/b", "/c"}
    put(harness, rid, "d/e", b"x")
    reply = harness.call("GET", f"/sandboxes/{rid}/walk?root=/")
    assert reply.status == 413
    assert reply.json()["error"] == "TooLarge"
    assert "more than 3 files (SANDBOXD_WALK_MAX)" in reply.json()["detail"]
    assert set(walk(harness, rid, "/d")) == {"/d/e"}  # a narrower root still answers


def test_a_walk_written_a_part_at_a_time_is_the_same_bytes(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b/c", "b/d", 'q"uote', "e/f/g"):
        put(harness, rid, name, b"x")
    whole = harness.call("GET", f"/sandboxes/{rid}/walk").body
    monkeypatch.setattr(file_routes, "WALK_PART", 1)  # every directory its own part
    streamed = harness.call("GET", f"/sandboxes/{rid}/walk")
    assert streamed.status == 200
    assert streamed.body == whole
    assert streamed.length is None  # chunked: written as it was made
    assert len(json.loads(whole)["entries"]) == 5


def test_a_walk_past_the_limit_while_written_is_cut_short(
    settings: dict[str, str], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings["walk-max"] = "2"
    harness, rid = sandbox_of_files(request, ("a/1", "b/2", "c/3"))
    monkeypatch.setattr(file_routes, "WALK_PART", 1)
    # The tree grew between the count and the walk: the answer is cut, never taken whole.
    assert_walk_cut_short(harness, rid, monkeypatch)


def test_a_walk_past_walk_bytes_max_answers_413_naming_it(
    settings: dict[str, str], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings["walk-bytes-max"] = "200"
    harness, rid = sandbox_of_files(request, ("a/1", "b/2"))
    fits = harness.call("GET", f"/sandboxes/{rid}/walk")
    assert fits.status == 200 and len(fits.body) <= 200
    put(harness, rid, "c/3", b"x")
    for part in (file_routes.WALK_PART, 1):  # answered whole, then measured before it is sent
        monkeypatch.setattr(file_routes, "WALK_PART", part)
        reply = harness.call("GET", f"/sandboxes/{rid}/walk")
        assert reply.status == 413 and reply.json()["error"] == "TooLarge"
        assert "passes 200 bytes (SANDBOXD_WALK_BYTES_MAX)" in reply.json()["detail"]
    # The tree grew between the measure and the walk: the answer is cut, never taken whole.
    assert_walk_cut_short(harness, rid, monkeypatch)
