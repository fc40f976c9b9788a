"""Which commands of a sandbox go to its zygote: the zygote is made from the sandbox's own chain
(``SandboxIsolation.zygote``, built where the sandbox's argv is built, never parsed back from
it), and the sandbox's spawner hands that zygote its execs and background processes alone.
The zygote's own life: tests/isolation/test_isolation_zygotes.py."""

from pathlib import Path

from attrs import evolve
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorProcess

from sandboxd.core.layout import Layout
from sandboxd.isolation.base import Identity, Isolation
from sandboxd.isolation.exec.helper import HelperWrapper
from sandboxd.isolation.exec.spawn_server import Spawner, SpawnServer
from sandboxd.isolation.exec.zygotes import PLACEHOLDER_COMMAND, PLACEHOLDER_CWD, Zygotes
from sandboxd.isolation.sandbox import SandboxIsolation
from sandboxd.isolation.uids import NumericUidPool
from tests.isolation.test_isolation_namespaces import RID, Runner, namespaces
from tests.support.fakes import FakeCgroups, SyncFiles, wrap

HELPER = "/h/sandboxd-exec"
IDENTITY = Identity(300001, 300001)
REACTOR: IReactorProcess = reactor


def bundle(tmp_path: Path, zygotes: bool = True, server_helper: str = HELPER) -> Isolation:
    """A bundle of the helper's chain (its namespaces made and pinned for :data:`RID`), with
    a spawn server of ``server_helper``, and zygotes unless ``zygotes`` is false."""
    pins = namespaces(tmp_path, Runner())
    (tmp_path / ".ns").mkdir(parents=True)
    pins.create(RID, "/root/x/tmp", "/root/x/workspace", pins.network.offered["none"])
    server = SpawnServer(server_helper)
    helper = HelperWrapper(HELPER, seccomp=True)
    return Isolation(
        name="fake",
        uids=NumericUidPool(300000, 300009),
        cgroups=FakeCgroups(),
        fs=SyncFiles(),
        wrap=helper,
        own_work_wrap=evolve(helper, no_ptrace=True),
        owns_files=True,
        namespaces=pins,
        spawn_server=server,
        zygotes=Zygotes(server) if zygotes else None,
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
