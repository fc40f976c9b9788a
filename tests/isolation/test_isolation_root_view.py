"""A template's root for a sandbox, without root: the directories made for it, the files the
helper reads beside the pins, and the refusals (the root switch itself is tried for real in
``tests/kernel/test_templates_run.py``)."""

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from attrs import define

from sandboxd.isolation.base import Identity
from sandboxd.isolation.namespaces.root_view import HOSTS_TEXT, RootView
from sandboxd.isolation.namespaces.shell import ShellCreator, ShellPrograms
from sandboxd.isolation.network.modes import NoNetwork
from tests.isolation.test_isolation_namespaces import RID, Runner, namespaces


def test_the_root_directories_are_made_in_the_sandboxs_top(tmp_path: Path) -> None:
    view = RootView("/t/lower", str(tmp_path))
    old = os.umask(0o077)
    try:
        view.prepare()
    finally:
        os.umask(old)
    assert (tmp_path / "root").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "root/upper").stat().st_mode & 0o777 == 0o755  # the new root's mode
    assert (tmp_path / "root/work").is_dir() and (tmp_path / "root/merged").is_dir()
    assert view.spec().splitlines() == [
        f"lowerdir=/t/lower,upperdir={tmp_path}/root/upper,workdir={tmp_path}/root/work",
        f"{tmp_path}/root/merged",
        str(tmp_path),
    ]


def test_a_path_with_a_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="overlay cannot name"):
        RootView("/t/a\nb", str(tmp_path)).prepare()
    assert not (tmp_path / "root").exists()


def test_the_overlay_options_separators_are_escaped_in_paths(tmp_path: Path) -> None:
    top = tmp_path / "a,b:c"
    top.mkdir()
    view = RootView("/t/name:tag/a\\b,c", str(top))
    view.prepare()
    escaped = str(top).replace(",", "\\,").replace(":", "\\:")
    assert view.spec().splitlines()[0] == (
        "lowerdir=/t/name\\:tag/a\\\\b\\,c,"
        f"upperdir={escaped}/root/upper,workdir={escaped}/root/work"
    )
    assert view.spec().splitlines()[1:] == [f"{top}/root/merged", str(top)]


def test_the_root_files_go_beside_the_pins(tmp_path: Path) -> None:
    (tmp_path / ".ns").mkdir()
    ns = namespaces(tmp_path, Runner())
    assert ns.switches_root
    view = RootView("/t/lower", "/t/top")
    ns.create(RID, "/t", "/w", NoNetwork(), (Identity(7001, 7002), "/h"), view)
    directory = tmp_path / ".ns" / RID
    assert (directory / "root").read_text() == view.spec()
    assert (directory / "hosts").read_text() == HOSTS_TEXT
    assert (directory / "root").stat().st_mode & 0o777 == 0o644
    # Commands enter the switched root; the daemon's own work the view before the switch.
    assert ns.enter(RID, ["x"])[3:6] == [str(directory / p) for p in ("ipc", "net", "mnt")]
    own = ns.enter(RID, ["x"], own_work=True)[3:6]
    assert own == [str(directory / p) for p in ("ipc", "net", "mnt-host")]
    ns.remove(RID)
    assert not directory.exists()


def test_a_root_is_refused_where_it_cannot_be_switched(tmp_path: Path) -> None:
    (tmp_path / ".ns").mkdir()
    view = RootView("/t/lower", "/t/top")
    no_mount = namespaces(tmp_path, Runner())
    no_mount.kinds = frozenset({"ipc", "net"})
    shell = namespaces(tmp_path, Runner())
    shell.creator = ShellCreator(ShellPrograms("/s", "/u", "/n", "/m", "/i"))
    off = namespaces(tmp_path, Runner())
    off.kinds = frozenset()
    for ns in (no_mount, shell, off):
        assert not ns.switches_root
        with pytest.raises(OSError, match="needs the mount namespace and the exec helper"):
            ns.create(RID, "/t", "/w", NoNetwork(), None, view)
    assert os.listdir(tmp_path / ".ns") == []


@define
class NoOverlay(Runner):
    """A helper whose overlay the kernel refuses (a state root on an overlay itself)."""

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        if argv[1] == "namespaces" and Path(argv[2], argv[3], "root").exists():
            self.argvs.append(list(argv))
            return 125, "sandboxd-exec: mount /x/root/merged: Invalid argument"
        return super().__call__(argv)


def test_start_up_finds_whether_a_root_can_be_switched_here(tmp_path: Path) -> None:
    runner = Runner()
    works = namespaces(tmp_path / "works", runner)
    works.prepare()
    assert len(runner.argvs) == 2 and works.switches_root
    assert sorted(os.listdir(works.nsroot)) == []  # both probes removed, the root's too
    works.close()

    runner = NoOverlay()
    refused = namespaces(tmp_path / "refused", runner)
    refused.prepare()  # the daemon starts all the same
    assert len(runner.argvs) == 2 and not refused.switches_root
    assert sorted(os.listdir(refused.nsroot)) == []
    with pytest.raises(OSError, match="needs the mount namespace and the exec helper"):
        refused.create(RID, "/t", "/w", NoNetwork(), None, RootView("/t/lower", "/t/top"))
    refused.close()
