"""E2B's ``/home/user`` inside commands: with a mount namespace (root, real isolation) the
workspace *is* ``/home/user`` for the programs a command runs, its default cwd and ``HOME``,
and the host's ``/home`` is out of sight; without one (``--namespaces=none``, or
``--isolation=none``) the commands run in the workspace's real path, and say so in ``pwd`` and
``HOME`` (docs/e2b.rst, *Paths*)."""

import os
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from sandboxd.isolation.namespaces.pins import home_coverable
from tests.e2b.conftest import E2BDaemon, point_sdk_at

FRONTS = {
    "mount-on": "isolated_front",
    "mount-off": "unnamespaced_front",
    "isolation-none": "unisolated_front",
}


@pytest.fixture(params=sorted(FRONTS))
def front(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    point_sdk_at(monkeypatch, request.getfixturevalue(FRONTS[request.param]))
    yield request.param


@pytest.fixture
def box(front: str) -> Iterator[Sandbox]:
    with Sandbox.create(timeout=60) as created:  # killed on leaving
        yield created


def test_the_workspace_is_home_user_in_commands(
    monkeypatch: pytest.MonkeyPatch, isolated_front: E2BDaemon
) -> None:
    if not home_coverable():
        pytest.skip("this host has no /home directory to cover")
    point_sdk_at(monkeypatch, isolated_front)
    sbx = Sandbox.create(timeout=60)
    try:
        sbx.files.write("/home/user/a.txt", "alpha")
        assert sbx.commands.run("cat /home/user/a.txt").stdout == "alpha"
        assert sbx.commands.run("cat a.txt").stdout == "alpha"
        assert sbx.commands.run("cd /home/user && cat ./a.txt").stdout == "alpha"
        assert sbx.commands.run("pwd").stdout == "/home/user\n"
        assert sbx.commands.run("echo $HOME $USER; cat ~/a.txt").stdout == "/home/user user\nalpha"
        sbx.files.make_dir("sub")
        assert sbx.commands.run("pwd", cwd="/home/user/sub").stdout == "/home/user/sub\n"
        sbx.commands.run("echo beta > /home/user/b")
        assert sbx.files.read("/home/user/b") == "beta\n"
        # an envs= HOME still wins over the default, as any variable given does
        assert sbx.commands.run("echo $HOME", envs={"HOME": "/tmp"}).stdout == "/tmp\n"
    finally:
        sbx.kill()


def test_the_hosts_home_is_seen_only_without_a_mount_namespace(front: str, box: Sandbox) -> None:
    if not home_coverable():
        pytest.skip("this host has no /home directory to cover")
    listed = box.commands.run("ls -A /home").stdout.split()
    if front == "mount-on":
        assert listed == ["user"]
    else:  # the host's own /home: what the mount layer hides
        assert listed == sorted(os.listdir("/home"))


def test_without_a_mount_namespace_commands_say_the_real_path(front: str, box: Sandbox) -> None:
    box.files.write("/home/user/a.txt", "alpha")
    cwd, home, user = box.commands.run("pwd; echo $HOME; echo $USER").stdout.split("\n")[:3]
    assert user == "user" and home == cwd
    assert box.commands.run("cat a.txt; cat $HOME/a.txt").stdout == "alpha" * 2
    if front == "mount-on" and home_coverable():
        assert cwd == "/home/user"
    else:  # no pretence: the workspace's real path, never a /home/user that is not it
        assert cwd != "/home/user" and cwd.endswith("/workspace"), cwd
        if not os.path.exists("/home/user"):
            assert box.commands.run("test -e /home/user/a.txt || echo absent").stdout == "absent\n"
