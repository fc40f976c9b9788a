"""Helpers of the kernel tests of the namespace layers (docs/isolation.rst, "Namespaces").

Two ways in: a sandbox's namespaces made directly, as root, each way the daemon can make them
(the exec helper, its server, the shell chain; :func:`every_layer`, :func:`run_in`), and a pair
of real daemons, one with a layer on and one with it turned off by name
(:func:`on_and_off`), so that each attack is shown refused and shown to succeed.
"""

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sandboxd.isolation.exec.helper import HELPER, helper_problem
from sandboxd.isolation.namespaces.creators import Creator, HelperCreator
from sandboxd.isolation.namespaces.kinds import ALL
from sandboxd.isolation.namespaces.pins import PLACES, Namespaces, kept_directories
from sandboxd.isolation.namespaces.server import NamespaceServer
from sandboxd.isolation.namespaces.shell import ShellCreator, ShellPrograms
from sandboxd.isolation.network.modes import HostNetwork, NetworkPolicy, NoNetwork
from tests.kernel.kernel_http import KernelDaemon, isolation_problem
from tests.support.uids import UID_BLOCK

SHARED = Path("/tmp/sandboxd-tests")
"""Where the state roots go: under ``/tmp``, so that the kept directory is bound back, as in
the test set-ups."""

RID = "0123456789abcdef"

CREATORS = ["helper-server", "helper", "shell"]
"""Each way the namespaces are made: the helper's server, the helper, ``unshare(1)``."""


@contextmanager
def shared_root(prefix: str) -> Iterator[Path]:
    """A fresh state root in :data:`SHARED` (mode 0711, as the daemon makes its own), removed
    after."""
    SHARED.mkdir(mode=0o711, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=SHARED))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_creator(which: str) -> Creator:
    """The creator of way ``which`` (one of :data:`CREATORS`); skips where the helper was not
    built."""
    if which.startswith("helper"):
        problem = helper_problem(HELPER, as_root=True)
        if problem is not None:
            pytest.skip(problem)
        return HelperCreator(HELPER)
    return ShellCreator(ShellPrograms.find())


def every_layer(root: Path, which: str) -> Namespaces:
    """Every namespace layer the ``which`` way makes (``all``: ``pid`` with the helper only),
    pinned in ``root/.ns``."""
    policy = NetworkPolicy({"none": NoNetwork(), "host": HostNetwork()}, ("none", "host"), "none")
    ns = Namespaces(
        kinds=frozenset(ALL) if which.startswith("helper") else frozenset(ALL) - {"pid"},
        nsroot=str(root / ".ns"),
        network=policy,
        creator=make_creator(which),
        keep=kept_directories(PLACES, [str(root)]),
        shm_bytes=8 << 20,
    )
    if which == "helper-server":
        ns.run = NamespaceServer(HELPER)
    return ns


def create(ns: Namespaces, root: Path, rid: str = RID) -> None:
    """Make sandbox ``rid``'s namespaces (network mode ``none``), its ``tmp`` and workspace
    made first in ``root/rid``."""
    for name in ("tmp", "workspace"):
        (root / rid / name).mkdir(parents=True)
    ns.create(rid, str(root / rid / "tmp"), str(root / rid / "workspace"), NoNetwork())


def run_in(ns: Namespaces, rid: str, which: str, script: str) -> str:
    """``sh -c script`` as root in ``rid``'s namespaces, which must succeed; its stdout."""
    argv = ["/bin/sh", "-c", script]
    if which.startswith("helper"):
        argv = [HELPER, "session", "/", *argv]
    done = subprocess.run(
        ns.enter(rid, argv), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done
    return done.stdout


@contextmanager
def on_and_off(
    factory: pytest.TempPathFactory,
    name: str,
    on: tuple[str, ...],
    off: tuple[str, ...],
    uids: int = UID_BLOCK,
) -> Iterator[dict[str, KernelDaemon]]:
    """Two real daemons (``--memory-max=128M``), ``"on"`` started with the options ``on`` and
    ``"off"`` with ``off`` (the layer under test turned off), both stopped after; skips where
    real isolation is out of reach."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    started = {}
    try:
        for layer, options in (("on", on), ("off", off)):
            path = factory.mktemp(f"{name}-{layer}")
            started[layer] = KernelDaemon.start(path, "--memory-max=128M", *options, uids=uids)
        yield started
    finally:
        for daemon in started.values():
            daemon.stop()
