"""The layers beyond uid + cgroup at start-up: each in force unless turned off by name, loudly.

seccomp (the helper's filter, checked by running it), umask, socket buffers (v1: charged by
the driver; v2: the kernel's, unless booted with ``cgroup.memory=nosocket``), and the
``fs.protected_*`` warnings. The filter itself and what it refuses:
``test_isolation_seccomp_filter`` and ``tests/kernel/test_seccomp.py``.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogLevel, formatEvent, globalLogPublisher
from zope.interface import provider

from sandboxd.isolation import layers
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.cgroups.cgroup1 import Cgroup1Driver
from sandboxd.isolation.exec.helper import HELPER, HelperWrapper, run_program, seccomp_problem
from sandboxd.isolation.exec.wrapper import Wrapper
from sandboxd.isolation.select import build_isolation
from tests.isolation.test_isolation_select import POOL, Machine, config

HELPER_PATH = "/opt/sd/sandboxd-exec"  # root's own in test_isolation_select's fake lstat
ALL_LAYERS = (layers.SECCOMP, layers.UMASK, layers.SOCKET_BUFFERS, layers.CPU_PLACEMENT)


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """The text of every warning logged while the test runs."""
    seen: list[str] = []

    @provider(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        if event.get("log_level") == LogLevel.warn:
            seen.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        yield seen
    finally:
        globalLogPublisher.removeObserver(observe)


@pytest.mark.parametrize("v1", [True, False])
def test_every_layer_by_default(tmp_path: Path, v1: bool, warnings: list[str]) -> None:
    machine = Machine(tmp_path, v2=None if v1 else "memory cpu pids cpuset", v1=v1)
    host = machine.host(helper=HELPER_PATH)
    iso = build_isolation(config(tmp_path, "auto", seccomp="default"), Clock(), POOL, host)
    assert iso.layers == ALL_LAYERS
    assert machine.ran == [[HELPER_PATH, "seccomp-check"]]
    assert isinstance(iso.wrap, HelperWrapper)
    assert (iso.wrap.seccomp, iso.wrap.umask) == (True, 0o077)
    if v1:
        assert isinstance(iso.cgroups, Cgroup1Driver) and iso.cgroups.socket_buffers
    assert warnings == []


def test_a_filter_the_kernel_does_not_enforce_stops_start_up(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    machine.seccomp_check = (125, "sandboxd-exec: seccomp: Invalid argument")
    with pytest.raises(IsolationUnavailable, match=r"^seccomp: seccomp: Invalid argument; .*=off"):
        build_isolation(
            config(tmp_path, "auto", seccomp="default"),
            Clock(),
            POOL,
            machine.host(helper=HELPER_PATH),
        )
    assert machine.oom == []


def test_the_shell_chain_cannot_filter_so_it_is_refused(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    with pytest.raises(IsolationUnavailable, match=r"^seccomp: the filter needs the exec helper"):
        build_isolation(config(tmp_path, "auto", seccomp="default"), Clock(), POOL, machine.host())
    assert machine.ran == []


def test_each_layer_turned_off_by_name_is_said(tmp_path: Path, warnings: list[str]) -> None:
    machine = Machine(tmp_path, v2=None, v1=True)
    settings = {"umask": "022", "socket_buffers": "off", "cpu_placement": "shared"}
    iso = build_isolation(config(tmp_path, "auto", **settings), Clock(), POOL, machine.host())
    assert iso.layers == ()
    assert isinstance(iso.wrap, Wrapper) and iso.wrap.umask == 0o022
    assert isinstance(iso.cgroups, Cgroup1Driver) and not iso.cgroups.socket_buffers
    assert machine.ran == []
    said = "\n".join(warnings)
    for layer in ALL_LAYERS:
        assert f"layer {layer} is OFF" in said
    assert "SANDBOXD_SECCOMP=off" in said and "SANDBOXD_UMASK=022" in said
    assert "SANDBOXD_CPU_PLACEMENT=shared" in said


def test_without_a_delegated_cpuset_placement_is_off_and_said(
    tmp_path: Path, warnings: list[str]
) -> None:
    """CPU placement is a matter of latency, not of isolation: without the cpuset controller,
    start-up goes on and says why every sandbox runs on every CPU."""
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    iso = build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host())
    assert layers.CPU_PLACEMENT not in iso.layers
    (said,) = [line for line in warnings if layers.CPU_PLACEMENT in line]
    assert f"layer {layers.CPU_PLACEMENT} is OFF" in said
    assert "the cpuset controller is not delegated" in said


def test_the_helper_without_the_filter(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    iso = build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host(helper=HELPER_PATH))
    assert isinstance(iso.wrap, HelperWrapper) and not iso.wrap.seccomp
    assert iso.layers == (layers.UMASK, layers.SOCKET_BUFFERS)


def test_v2_booted_without_socket_charging(tmp_path: Path, warnings: list[str]) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    machine.files["/proc/cmdline"] = "quiet cgroup.memory=nokmem,nosocket\n"
    with pytest.raises(IsolationUnavailable, match=r"^socket buffers: .*cgroup.memory=nosocket"):
        build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host())
    iso = build_isolation(
        config(tmp_path, "auto", socket_buffers="off"), Clock(), POOL, machine.host()
    )
    assert layers.SOCKET_BUFFERS not in iso.layers
    assert any(f"layer {layers.SOCKET_BUFFERS} is OFF" in w for w in warnings)


def test_v2_charges_socket_buffers_even_when_asked_not_to(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    iso = build_isolation(
        config(tmp_path, "auto", socket_buffers="off"), Clock(), POOL, machine.host()
    )
    assert layers.SOCKET_BUFFERS in iso.layers  # the kernel's doing: listed as it holds


def test_unprotected_sysctls_are_warned_about(tmp_path: Path, warnings: list[str]) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    machine.files["/proc/sys/fs/protected_symlinks"] = "0\n"
    machine.files["/proc/sys/fs/protected_regular"] = "0\n"
    del machine.files["/proc/sys/fs/protected_hardlinks"]  # a kernel without it: nothing to say
    build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host())
    said = [w for w in warnings if "fs.protected" in w]
    assert len(said) == 2
    assert "fs.protected_symlinks is 0" in said[0] and "fs.protected_regular is 0" in said[1]


def test_none_has_the_umask_but_never_the_filter(tmp_path: Path, warnings: list[str]) -> None:
    machine = Machine(tmp_path, v2=None, v1=False, euid=1000)
    iso = build_isolation(
        config(tmp_path, "none", seccomp="default"), Clock(), POOL, machine.host()
    )
    assert iso.layers == (layers.UMASK,)
    assert machine.ran == []
    assert any(f"layer {layers.SECCOMP} is OFF (--isolation=none" in w for w in warnings)
    quiet = build_isolation(config(tmp_path, "none", umask="002"), Clock(), POOL, machine.host())
    assert quiet.layers == ()


@pytest.mark.parametrize(
    ("umask", "isolates"),
    [(0o077, True), (0o027, True), (0o007, True), (0o022, False), (0o002, False)],
)
def test_umask_isolates_when_others_get_nothing(umask: int, isolates: bool) -> None:
    assert layers.umask_isolates(umask) is isolates


@pytest.mark.parametrize(
    ("cmdline", "uncharged"),
    [
        ("quiet", False),
        ("cgroup.memory=nokmem", False),
        ("cgroup.memory=nosocket", True),
        ("ro cgroup.memory=nokmem,nosocket quiet", True),
        ("cgroup_disable=memory", False),
    ],
)
def test_v2_sockets_uncharged(cmdline: str, uncharged: bool) -> None:
    assert layers.v2_sockets_uncharged(cmdline) is uncharged


def test_seccomp_problem_names_what_the_check_said() -> None:
    def says(code: int, text: str) -> Any:
        return lambda argv: (code, text)

    assert seccomp_problem("/x", says(0, "seccomp: enforced")) is None
    assert seccomp_problem("/x", says(125, "sandboxd-exec: seccomp: Invalid argument")) == (
        "seccomp: Invalid argument"
    )
    assert seccomp_problem("/x", says(-31, "")) == "seccomp-check exited -31"


def test_run_program_gives_the_exit_code_and_output() -> None:
    assert run_program(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\nerr")


@pytest.mark.skipif(not Path(HELPER).exists(), reason="the helper is not built (no cc)")
def test_the_built_helpers_filter_is_enforced_by_this_kernel() -> None:
    assert seccomp_problem(HELPER) is None
