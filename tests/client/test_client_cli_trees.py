"""``sandboxctl put``/``get`` of trees: the path arithmetic, and a listing that would leave
LOCAL (a hostile or broken service) refused before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from sandboxd_client import SandboxHandle, WalkEntry
from sandboxd_client.cli._trees import get_tree, local_dirs, local_files, remote_relative


@pytest.mark.parametrize(
    ("path", "root", "relative"),
    [
        ("/proj/a/b.txt", "proj", "a/b.txt"),
        ("proj/a/b.txt", "/proj/", "a/b.txt"),
        ("/a.txt", "/", "a.txt"),
        ("/proj", "proj", ""),
    ],
)
def test_remote_relative(path: str, root: str, relative: str) -> None:
    assert remote_relative(path, root) == relative


def test_local_tree_skips_links_and_names_empty_directories(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "f").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a" / "f")
    assert [rel for _, rel in local_files(str(tmp_path))] == ["a/f"]
    assert sorted(local_dirs(str(tmp_path))) == ["a/b", "empty"]


class Listing:
    """A service whose walk lists what the test says (and which must never be downloaded)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    async def walk(self, handle: Any, root: str) -> list[WalkEntry]:
        return [WalkEntry(p, 1, 1) for p in self.paths]

    async def download_to_file(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing may be downloaded")


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("bad", ["/proj/../../etc/x", "/proj/a//b", "/proj/./c"])
async def test_a_listed_path_outside_local_is_refused(tmp_path: Path, bad: str) -> None:
    client: Any = Listing(["/proj/ok.txt", bad])

    async def one_file() -> None:
        raise AssertionError("a tree, not a file")

    with pytest.raises(ValueError, match="not below"):
        await get_tree(client, SandboxHandle("h"), "proj", str(tmp_path / "out"), print, one_file)
    assert not (tmp_path / "etc").exists()
