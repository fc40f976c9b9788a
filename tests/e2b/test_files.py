"""``files`` through the unmodified SDK: read/write of text, bytes and several files, list
with depth, stat, exists, make_dir, rename, remove, /tmp, refused paths, and watch."""

import io
import time
import urllib.request

import pytest
from e2b import (
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

from tests.e2b.conftest import TOKEN, E2BDaemon


def test_round_trips(any_sandbox: Sandbox) -> None:
    sandbox = any_sandbox
    info = sandbox.files.write("/home/user/a.txt", "héllo")
    assert info.path == "/home/user/a.txt" and info.name == "a.txt"
    assert sandbox.files.read("a.txt") == "héllo"
    blob = bytes(range(256)) * 300
    sandbox.files.write("bin/blob", blob)
    assert bytes(sandbox.files.read("/home/user/bin/blob", format="bytes")) == blob
    written = sandbox.files.write_files(
        [WriteEntry(path="m/one", data="1"), WriteEntry(path="/home/user/m/two", data=b"2")]
    )
    assert sorted(w.path for w in written) == ["/home/user/m/one", "/home/user/m/two"]
    assert sandbox.files.read("m/two") == "2"
    sandbox.files.write("file-object", io.BytesIO(b"from a file object"))  # octet-stream
    assert sandbox.files.read("file-object") == "from a file object"
    assert b"".join(sandbox.files.read("file-object", format="stream")) == b"from a file object"
    sandbox.files.write("gz.txt", b"zipped", gzip=True)
    assert sandbox.files.read("gz.txt") == "zipped"
    assert sandbox.commands.run("cat a.txt m/one").stdout == "héllo1"


def test_list_stat_exists_make_dir(sandbox: Sandbox) -> None:
    sandbox.files.write("d/e/f.txt", "x")
    top = sandbox.files.list("/home/user")
    assert [(e.name, e.type) for e in top] == [("d", FileType.DIR)]
    deep = sandbox.files.list("d", depth=3)
    assert [e.path for e in deep] == ["/home/user/d/e", "/home/user/d/e/f.txt"]
    stat = sandbox.files.get_info("d/e/f.txt")
    assert stat.type == FileType.FILE and stat.size == 1 and stat.owner == "user"
    assert sandbox.files.exists("d/e") and not sandbox.files.exists("nope")
    assert sandbox.files.make_dir("new/deep") is True
    assert sandbox.files.make_dir("new/deep") is False
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("missing")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("missing")


def test_modes_and_links_as_envd_states_them(sandbox: Sandbox) -> None:
    """``mode`` is the permission bits only (Go's ``FileMode.Perm``); a link is stated by
    its target: its type, and the target's absolute path."""
    sandbox.files.write("linked/test.txt", "Hello")
    directory = sandbox.files.get_info("linked")
    assert (directory.mode, directory.permissions) == (0o755, "drwxr-xr-x")
    assert sandbox.files.get_info("linked/test.txt").mode == 0o644
    sandbox.commands.run("ln -s test.txt link && ln -s missing dangling", cwd="/home/user/linked")
    link = sandbox.files.get_info("linked/link")
    assert link.type == FileType.FILE and link.mode == 0o644
    assert link.symlink_target == "/home/user/linked/test.txt"
    listed = {e.name: e for e in sandbox.files.list("linked")}
    assert listed["link"].type == FileType.FILE and "dangling" not in listed  # type unknown
    assert sandbox.files.get_info("linked/dangling").symlink_target == "/home/user/linked/dangling"


def test_rename_remove(sandbox: Sandbox) -> None:
    sandbox.files.write("old.txt", "data")
    moved = sandbox.files.rename("old.txt", "dir/new.txt")
    assert moved.path == "/home/user/dir/new.txt"
    assert not sandbox.files.exists("old.txt")
    assert sandbox.files.read("dir/new.txt") == "data"
    sandbox.files.remove("dir")
    assert not sandbox.files.exists("dir")
    sandbox.files.remove("dir")  # nothing there: no error, as envd's os.RemoveAll
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("dir/new.txt")


def test_tmp_is_the_sandboxes_own(any_sandbox: Sandbox) -> None:
    sandbox = any_sandbox
    sandbox.files.write("/tmp/scratch", "t")
    assert sandbox.files.read("/tmp/scratch") == "t"
    assert "scratch" in [e.name for e in sandbox.files.list("/tmp")]
    assert not sandbox.files.exists("/home/user/scratch")
    assert sandbox.commands.run('cat "$TMPDIR/scratch"').stdout == "t"


@pytest.mark.parametrize("path", ["/etc/passwd", "/home/other", "/home/user/../../etc/passwd"])
def test_paths_outside_are_refused(sandbox: Sandbox, path: str) -> None:
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read(path)
    with pytest.raises(InvalidArgumentException):
        sandbox.files.exists(path)
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write(path, "x")


def test_root_user_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="no root in a sandbox"):
        sandbox.files.write("x", "y", user="root")
    with pytest.raises(SandboxException, match="no root in a sandbox"):
        sandbox.files.list("/home/user", user="root")


def test_a_watch_sees_writes_as_envd_makes_them(sandbox: Sandbox) -> None:
    """A write is what envd's is (open, chown, write): a new file is CREATE, CHMOD, WRITE,
    an overwrite has WRITE; each is there as soon as the write returns."""
    sandbox.files.write("seen/nested/old.txt", "before")
    flat = sandbox.files.watch_dir("seen")
    deep = sandbox.files.watch_dir("seen", recursive=True)
    try:
        sandbox.files.write("seen/old.txt", "first")
        sandbox.files.write("seen/new.txt", "created")
        told = [(e.name, e.type.name) for e in flat.get_new_events()]
        assert told == [
            ("old.txt", "CREATE"),
            ("old.txt", "CHMOD"),
            ("old.txt", "WRITE"),
            ("new.txt", "CREATE"),
            ("new.txt", "CHMOD"),
            ("new.txt", "WRITE"),
        ]
        sandbox.files.write("seen/old.txt", "overwritten")
        assert ("old.txt", "WRITE") in [(e.name, e.type.name) for e in flat.get_new_events()]
        deep.get_new_events()
        sandbox.files.write("seen/nested/old.txt", "after")
        kinds = [e.type.name for e in deep.get_new_events() if e.name == "nested/old.txt"]
        assert "WRITE" in kinds and "CREATE" not in kinds
        sandbox.files.write("seen/nested/new.txt", "x")
        told = [(e.name, e.type.name) for e in deep.get_new_events()]
        assert told[0] == ("nested/new.txt", "CREATE") and len(told) == 3
    finally:
        flat.stop()
        deep.stop()
    assert sandbox.files.read("seen/old.txt") == "overwritten"


def native_upload(front: E2BDaemon, sandbox_id: str, path: str, data: bytes) -> None:
    """A write through the native API (its hidden temporary file renamed into place)."""
    url = f"{front.daemon.url}/sandboxes/{sandbox_id}/file?path={path}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    request = urllib.request.Request(url, data=data, method="PUT", headers=headers)
    urllib.request.urlopen(request, timeout=30).close()


def test_a_native_upload_is_one_create_without_its_temporary_file(
    e2b_daemon: E2BDaemon, sandbox: Sandbox
) -> None:
    sandbox.files.make_dir("native")
    watcher = sandbox.files.watch_dir("native")
    try:
        native_upload(e2b_daemon, sandbox.sandbox_id, "native/put.txt", b"natively")
        assert [(e.name, e.type.name) for e in watcher.get_new_events()] == [("put.txt", "CREATE")]
    finally:
        watcher.stop()
    assert sandbox.files.read("native/put.txt") == "natively"


def test_polling_watch(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("w")
    watcher = sandbox.files.watch_dir("w", recursive=True)
    try:
        sandbox.files.write("w/created.txt", "1")
        sandbox.files.make_dir("w/sub")
        names: set[tuple[str, str]] = set()
        # A new directory is watched once the watch has seen it: files made in it before
        # that are not reported (as with envd), so new ones are made until one is.
        for n in range(200):
            sandbox.files.write(f"w/sub/inner{n}", "z")
            names |= {(e.name, e.type.name) for e in watcher.get_new_events()}
            if any(name.startswith("sub/inner") for name, _ in names):
                break
            time.sleep(0.05)
        assert ("created.txt", "CREATE") in names and ("sub", "CREATE") in names
        assert any(name.startswith("sub/inner") and kind == "CREATE" for name, kind in names)
        assert not any(".sandboxd-upload-" in name for name, _ in names)
    finally:
        watcher.stop()
