"""A fork's files (``sandboxd.core.fork``) without a daemon: the directories it hands to the
isolation, and a copy that fails (the copy itself, re-owned, is tried for real in
``tests/kernel/test_templates_run.py``)."""

from pathlib import Path

import pytest

from sandboxd.core.fork import ForkFailed, Prefilled, copy_tree
from sandboxd.core.layout import Layout
from sandboxd.isolation.base import Identity

RID = "0123456789abcdef"


def test_prefilled_directories_are_the_layouts_and_are_not_made_again(tmp_path: Path) -> None:
    layout = Layout(str(tmp_path), owns_files=False)
    directories = Prefilled(layout)
    directories.create(RID, Identity(1000, 1000))
    assert not (tmp_path / RID).exists()  # made by copy_sandbox, not here
    layout.create(RID, Identity(1000, 1000))
    assert directories.directory(RID) == layout.directory(RID)
    assert directories.workspace(RID) == layout.workspace(RID)
    assert directories.home(RID) == layout.home(RID)
    assert directories.tmp(RID) == layout.tmp(RID)
    directories.destroy(RID)
    assert not (tmp_path / RID).exists()


def test_a_copy_that_fails_says_why(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    with pytest.raises(ForkFailed, match=r"fork: cannot copy the source's files: .*missing"):
        copy_tree(str(tmp_path / "missing"), str(tmp_path / "target"))
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "file").write_text("kept")
    copy_tree(str(tmp_path / "source"), str(tmp_path / "target"))
    assert (tmp_path / "target" / "file").read_text() == "kept"
