"""A sandbox's zygote as its isolation knows it: made from the sandbox's own chain
(``SandboxIsolation.zygote``, built where the sandbox's argv is built, never parsed back from
it), handed its execs and background processes alone by the sandbox's spawner, and retired at
the sandbox's kill before its cgroups are killed. The zygote's own life (a stand-in server and
zygote): tests/isolation/test_isolation_zygotes.py."""

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest_twisted
from attrs import evolve
from twisted.internet import reactor
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorProcess

from sandboxd.core.layout import Layout
from sandboxd.isolation.base import Identity, Isolation
from sandboxd.isolation.exec.helper import HelperWrapper
from sandboxd.isolation.exec.spawn_server import Popen, Spawner, SpawnServer
from sandboxd.isolation.exec.zygotes import PLACEHOLDER_COMMAND, PLACEHOLDER_CWD, Zygotes
from sandboxd.isolation.sandbox import SandboxIsolation
from sandboxd.isolation.uids import NumericUidPool
from tests.isolation.test_isolation_namespaces import RID, Runner, namespaces
from tests.isolation.test_isolation_spawn_server import StandIn
from tests.isolation.test_isolation_zygotes import (
    Zygote,
    answer_server,
    never,
    ready,
    server_request,
    until,
)
from tests.support.fakes import FakeCgroups, SyncFiles, wrap

HELPER = "/h/sandboxd-exec"
IDENTITY = Identity(300001, 300001)
REACTOR: IReactorProcess = reactor


class KillSeesZygotes(FakeCgroups):
    """Records, at each kill, whether its sandbox had a live zygote."""

    def __init__(self) -> None:
        super().__init__()
        self.zygotes: Zygotes | None = None
        self.zygote_at_kill: list[bool] = []

    def kill(self, rid: str) -> Deferred[None]:
        assert self.zygotes is not None
        self.zygote_at_kill.append(rid in self.zygotes.live)
        return super().kill(rid)


def bundle(
    tmp_path: Path,
    zygotes: bool = True,
    server_helper: str = HELPER,
    popen: Popen = subprocess.Popen,
) -> Isolation:
    """A bundle of the helper's chain (its namespaces made and pinned for :data:`RID`), with
    a spawn server of ``server_helper`` started by ``popen``, and zygotes unless ``zygotes``
    is false."""
    pins = namespaces(tmp_path, Runner())
    (tmp_path / ".ns").mkdir(parents=True)
    pins.create(RID, "/root/x/tmp", "/root/x/workspace", pins.network.offered["none"])
    server = SpawnServer(server_helper, popen)
    helper = HelperWrapper(HELPER, seccomp=True)
    cgroups = KillSeesZygotes()
    cgroups.zygotes = Zygotes(server) if zygotes else None
    return Isolation(
        name="fake",
        uids=NumericUidPool(300000, 300009),
        cgroups=cgroups,
        fs=SyncFiles(),
        wrap=helper,
        own_work_wrap=evolve(helper, no_ptrace=True),
        owns_files=True,
        namespaces=pins,
        spawn_server=server,
        zygotes=cgroups.zygotes,
    )


def attach(iso: Isolation, tmp_path: Path) -> SandboxIsolation:
    return iso.attach(RID, IDENTITY, Layout(str(tmp_path / "root"), False))


def test_a_sandboxs_zygote_is_its_exec_chain_but_the_cwd_and_command(tmp_path: Path) -> None:
    iso = bundle(tmp_path)
    sandbox = attach(iso, tmp_path)
    spec = sandbox.zygote
    assert spec is not None and spec is sandbox.zygote, "made once for the sandbox"
    assert (spec.rid, spec.uid) == (RID, IDENTITY.uid)
    assert list(spec.argv) == sandbox.start_argv(PLACEHOLDER_CWD, PLACEHOLDER_COMMAND)
    assert spec.argv[:3] == (HELPER, "enter", "3"), "its namespaces, entered by the helper"
    cwd = spec.argv.index(PLACEHOLDER_CWD)
    assert spec.argv[cwd - 4 : cwd] == ("--seccomp=default", "sandbox", "300001", "300001")
    an_exec = sandbox.start_argv("/w/sub", ["ls", "-l"])
    assert an_exec == [*spec.argv[:cwd], "/w/sub", *spec.argv[cwd + 1 : -1], "ls", "-l"]
    # never a terminal's command nor the daemon's own work: their chains are not the zygote's
    terminal = sandbox.start_argv(PLACEHOLDER_CWD, PLACEHOLDER_COMMAND, terminal=True)
    own_work = sandbox.start_argv(PLACEHOLDER_CWD, PLACEHOLDER_COMMAND, own_work=True)
    assert "--ctty" in terminal and "--no-ptrace" in own_work
    assert "--ctty" not in spec.argv and "--no-ptrace" not in spec.argv
    spawner = sandbox.spawner(REACTOR)
    assert isinstance(spawner, Spawner)
    assert spawner.zygotes is iso.zygotes and spawner.sandbox is spec
    general = iso.spawner(REACTOR)
    assert isinstance(general, Spawner) and general.sandbox is None, "no sandbox's: no zygote"


def test_no_zygote_without_zygotes_or_off_the_helpers_chain(tmp_path: Path) -> None:
    iso = bundle(tmp_path, zygotes=False)
    sandbox = attach(iso, tmp_path)
    assert sandbox.zygote is None
    spawner = sandbox.spawner(REACTOR)
    assert isinstance(spawner, Spawner) and spawner.sandbox is None, "the server's alone"
    with_zygotes = bundle(tmp_path / "z")
    shell = attach(evolve(with_zygotes, wrap=wrap), tmp_path)  # the helper enters, not its step
    assert shell.start_argv("/", ["x"])[0] == HELPER and shell.zygote is None
    elsewhere = bundle(tmp_path / "e", server_helper="/elsewhere/sandboxd-exec")
    assert attach(elsewhere, tmp_path).zygote is None, "not the server's helper"
    no_pins = evolve(with_zygotes, namespaces=namespaces(tmp_path / "n", Runner()))
    spec = attach(no_pins, tmp_path).zygote
    assert spec is not None and spec.argv[:2] == (HELPER, "--umask=077"), "its sandbox step"


def in_thread(work: Callable[[str], None], rid: str) -> Deferred[None]:
    return maybeDeferred(work, rid)


@pytest_twisted.ensureDeferred
async def test_the_kill_of_a_sandbox_retires_its_zygote_before_its_cgroups(
    tmp_path: Path, fds: list[int]
) -> None:
    stand_in = StandIn()
    iso = bundle(tmp_path, popen=stand_in)
    zygotes, cgroups = iso.zygotes, iso.cgroups
    assert isinstance(zygotes, Zygotes) and isinstance(cgroups, KillSeesZygotes)
    sandbox = attach(iso, tmp_path)
    spec = sandbox.zygote
    assert spec is not None
    zygote = await ready(zygotes, stand_in, spec, fds)
    zygotes.retire("fedcba9876543210")  # another sandbox's kill: not this one's zygote
    assert RID in zygotes.live
    await Deferred.fromCoroutine(sandbox.dispose(in_thread))
    assert cgroups.zygote_at_kill == [False] and cgroups.removed == [RID]
    assert zygotes.live == {} and zygote.sock.recv(8) == b"", "retired: its socket ended"
    zygote.close()

    # its start under way at the kill: the server, asked already, starts one that ends at once
    server = StandIn()
    again = attach(bundle(tmp_path / "again", popen=server), tmp_path)
    assert again.zygote is not None and isinstance(again.bundle.zygotes, Zygotes)
    assert not again.bundle.zygotes.send(reactor, again.zygote, b"1\0x\0", fds, never)
    _, zygote_fds = await server_request(server)
    late = Zygote(zygote_fds, b"")
    await Deferred.fromCoroutine(again.dispose(in_thread))
    answer_server(server, late.pid)
    assert late.sock.recv(8) == b"", "it reads the end of its socket first"
    os.kill(late.pid, signal.SIGKILL)
    await until(late.gone)  # reaped
    late.close()
    iso.spawn_server.close()  # type: ignore[union-attr]
    again.bundle.spawn_server.close()  # type: ignore[union-attr]
