"""``sandboxd.core.files.entries``: stat and listings as plain values, never following a link."""

import os
from pathlib import Path

import pytest

from sandboxd.core.files import entries
from sandboxd.errors import BadRequest, PathNotFound, TooManyEntries


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f.txt").write_text("xy")
    (tmp_path / "link").symlink_to("/etc/passwd")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / ".sandboxd-upload-1234").write_text("hidden")
    return tmp_path


def test_stat_kinds(tree: Path) -> None:
    assert entries.stat_entry(str(tree), ()).kind == "dir"
    found = entries.stat_entry(str(tree), ("d", "e", "f.txt"))
    assert (found.kind, found.size, found.parts) == ("file", 2, ("d", "e", "f.txt"))
    link = entries.stat_entry(str(tree), ("link",))
    assert (link.kind, link.target) == ("symlink", "/etc/passwd")
    assert entries.stat_entry(str(tree), ("fifo",)).kind == "other"
    with pytest.raises(PathNotFound):
        entries.stat_entry(str(tree), ("missing",))
    with pytest.raises(PathNotFound):
        entries.stat_entry(str(tree), ("link", "passwd"))  # never through a link


def test_listing_depth_and_bounds(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [e.parts for e in entries.list_dir(str(tree), (), 1)]
    assert names == [("d",), ("fifo",), ("link",)]  # upload temporaries hidden
    deep = [e.parts for e in entries.list_dir(str(tree), ("d",), 5)]
    assert deep == [("d", "e"), ("d", "e", "f.txt")]
    with pytest.raises(PathNotFound):  # not a directory
        entries.list_dir(str(tree), ("d", "e", "f.txt"), 1)
    with pytest.raises(PathNotFound):
        entries.list_dir(str(tree), ("link",), 1)
    monkeypatch.setattr(entries, "ENTRIES_MAX", 2)
    assert len(entries.list_dir(str(tree), (), 3)) == 2


def test_listing_skips_what_changes_meanwhile(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_entry, real_open = entries._entry, os.open

    def vanishing(dir_fd: int, name: str, parts: tuple[str, ...]) -> entries.Entry:
        if name == "fifo":
            raise FileNotFoundError(name)
        return real_entry(dir_fd, name, parts)

    def refusing(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if path == "d" and "dir_fd" in kwargs:
            raise PermissionError(path)
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(entries, "_entry", vanishing)
    monkeypatch.setattr(os, "open", refusing)
    assert [e.parts for e in entries.list_dir(str(tree), (), 3)] == [("d",), ("link",)]


def test_make_dir_and_remove(tree: Path) -> None:
    assert entries.make_dir(str(tree), ("n", "m")) is True
    assert entries.make_dir(str(tree), ("n", "m")) is False
    assert entries.make_dir(str(tree), ()) is False
    with pytest.raises(PathNotFound):  # a file on the way
        entries.make_dir(str(tree), ("d", "e", "f.txt", "below"))
    entries.remove(str(tree), ("link",))
    assert Path("/etc/passwd").exists()
    entries.remove(str(tree), ("d",))
    assert not (tree / "d").exists()
    with pytest.raises(PathNotFound):
        entries.remove(str(tree), ("d",))
    with pytest.raises(BadRequest):
        entries.remove(str(tree), ())


def test_a_listing_past_its_answer_size_is_refused_as_it_goes(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry counts its name, its whole path and its link's target, besides the rest."""
    size = sum(
        entries.ENTRY_BYTES + len(name) + len(path) + len(target)
        for name, path, target in [
            ("d", "/d", ""),
            ("e", "/d/e", ""),
            ("f.txt", "/d/e/f.txt", ""),
            ("fifo", "/fifo", ""),
            ("link", "/link", "/etc/passwd"),
        ]
    )
    monkeypatch.setattr(entries, "LISTING_BYTES_MAX", size)
    assert len(entries.list_dir(str(tree), (), 3)) == 5
    monkeypatch.setattr(entries, "LISTING_BYTES_MAX", size - 1)
    with pytest.raises(TooManyEntries, match=f"the listing passes {size - 1} bytes"):
        entries.list_dir(str(tree), (), 3)
