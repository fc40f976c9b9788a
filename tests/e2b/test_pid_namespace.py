"""The E2B front over a daemon with a PID namespace per sandbox (``--namespaces=...,pid``),
through the unmodified SDK: the pids the front answers are the ones it later signals and
connects by (the relays', as the host numbers them), while the commands see the namespace's.

As root with the real isolation (skipped as a user); the layer itself is tried for real in
``tests/kernel/test_pid_namespace.py``.
"""

from collections.abc import Iterator

import pytest
from e2b import CommandExitException, Sandbox

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front


@pytest.fixture(scope="module")
def pid_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    with running_front(tmp_path_factory.mktemp("e2b-pid"), "--namespaces=ipc,mount,net,pid") as f:
        yield f


@pytest.fixture
def pid_sandbox(monkeypatch: pytest.MonkeyPatch, pid_front: E2BDaemon) -> Iterator[Sandbox]:
    point_sdk_at(monkeypatch, pid_front)
    with Sandbox.create(timeout=120) as created:  # killed on leaving
        yield created


def test_a_background_command_is_listed_connected_and_killed_by_its_pid(
    pid_sandbox: Sandbox,
) -> None:
    handle = pid_sandbox.commands.run("echo $$ > inside; sleep 60", background=True)
    assert handle.pid in [p.pid for p in pid_sandbox.commands.list()]
    # the background shell writes its pid when it gets to it: wait for that (30 s at most)
    wait = "until [ -s inside ]; do sleep 0.05; done; cat inside"
    inside = pid_sandbox.commands.run(wait, timeout=30)
    assert int(inside.stdout) < 10  # the namespace's own
    seen = pid_sandbox.commands.run("ps -e -o pid=,comm=").stdout.splitlines()
    assert all(int(line.split()[0]) < 20 for line in seen), seen  # no host process in sight
    again = pid_sandbox.commands.connect(handle.pid)
    assert pid_sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        again.wait()
    assert handle.pid not in [p.pid for p in pid_sandbox.commands.list()]
    assert pid_sandbox.commands.kill(handle.pid) is False
