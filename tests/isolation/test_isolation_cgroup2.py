"""The cgroup v2 driver against a fake unified hierarchy in a temporary directory."""

import errno
from pathlib import Path
from typing import Any

import pytest
from attrs import evolve

from sandboxd.isolation.base import CgroupStats, IsolationUnavailable, Limits
from sandboxd.isolation.cgroups.cgroup2 import SUPERVISOR, Cgroup2Driver
from sandboxd.isolation.cgroups.hierarchy import UNIFIED, Mount
from sandboxd.isolation.cgroups.polling import StillPopulated
from sandboxd.isolation.naming import instance_name
from tests.support.kernel_fakes import FakeKernel, settle, write

RID = "0123456789abcdef"
LIMITS = Limits(memory_bytes=50 << 20, cpu_cores=0.2, pids=20)
STATE = "/var/lib/sandboxd/sandboxes"


def mounts(base: Path) -> list[Mount]:
    return [Mount("/", str(base), "cgroup2", frozenset({"rw"}))]


def setup(
    tmp_path: Path, own: str = "/svc", cgroup_root: str | None = None, **fake_options: Any
) -> tuple[FakeKernel, Cgroup2Driver]:
    """A unified mount at ``tmp/cg`` with the daemon's cgroup ``own`` holding the daemon."""
    fake = FakeKernel(tmp_path / "cg", 2, **fake_options)
    fake.make_root()
    if own != "/":
        fake.make_cgroup(fake.base / own.strip("/"))
    fake.spawn(fake.base / own.strip("/"))  # the daemon itself...
    fake.pid = min(fake.members)  # ...whose pid getpid() answers
    driver = Cgroup2Driver.locate(
        mounts(fake.base), {UNIFIED: own}, cgroup_root, STATE, fake.clock, fake.kernel()
    )
    return fake, driver


def ready(tmp_path: Path, **fake_options: bool | float) -> tuple[FakeKernel, Cgroup2Driver]:
    fake, driver = setup(tmp_path, **fake_options)  # type: ignore[arg-type]
    driver.preflight()
    driver.create(RID, LIMITS)
    return fake, driver


# Locating the delegated subtree


def test_locate_uses_our_own_cgroup_and_an_instance_per_state_root(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    assert driver.delegated == str(fake.base / "svc")
    assert driver.instance == str(fake.base / "svc" / instance_name(STATE))
    assert driver.evict and driver.name == "cgroup2"


def test_locate_sees_through_our_own_supervisor_leaf(tmp_path: Path) -> None:
    base = tmp_path / "cg"
    own = {UNIFIED: f"/svc/{SUPERVISOR}"}
    driver = Cgroup2Driver.locate(mounts(base), own, None, STATE, None, None)  # type: ignore[arg-type]
    assert driver.delegated == str(base / "svc")


def test_locate_with_a_cgroup_root_never_evicts(tmp_path: Path) -> None:
    base = tmp_path / "cg"
    root = str(base / "delegated")
    driver = Cgroup2Driver.locate(mounts(base), {}, root, STATE, None, None)  # type: ignore[arg-type]
    assert driver.delegated == root
    assert not driver.evict


@pytest.mark.parametrize(
    ("found", "own", "message"),
    [
        ([], {UNIFIED: "/"}, "no cgroup2 hierarchy is mounted"),
        (None, {"memory": "/x"}, "no cgroup v2 line"),
    ],
)
def test_locate_refuses_in_one_line(
    tmp_path: Path, found: list[Mount] | None, own: dict[str, str], message: str
) -> None:
    where = mounts(tmp_path) if found is None else found
    with pytest.raises(IsolationUnavailable, match=message):
        Cgroup2Driver.locate(where, own, None, STATE, None, None)  # type: ignore[arg-type]


def test_locate_refuses_a_cgroup_the_mount_does_not_show(tmp_path: Path) -> None:
    bound = [Mount("/ns", str(tmp_path), "cgroup2", frozenset())]
    with pytest.raises(IsolationUnavailable, match="cgroup /other is not under"):
        Cgroup2Driver.locate(bound, {UNIFIED: "/other"}, None, STATE, None, None)  # type: ignore[arg-type]


# Preflight


def test_preflight_moves_the_daemon_out_and_enables_controllers(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    other = fake.spawn(fake.base / "svc")
    driver.preflight()
    svc = fake.base / "svc"
    leaf = str(svc / SUPERVISOR)
    assert fake.members[fake.pid][str(fake.base)] == leaf
    assert fake.members[other][str(fake.base)] == leaf
    moves = [text for path, text in fake.writes if path == f"{leaf}/cgroup.procs"]
    assert moves == [str(fake.pid), str(other)]  # the daemon first
    assert (svc / "cgroup.subtree_control").read_text().split() == ["memory", "cpu", "pids"]
    instance = Path(driver.instance)
    assert (instance / "cgroup.subtree_control").read_text().split() == ["memory", "cpu", "pids"]
    writes = len(fake.writes)
    driver.preflight()  # idempotent: nothing left to move or enable
    assert len(fake.writes) == writes


def test_unprepare_removes_the_instance_preflight_made(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    driver.preflight()
    assert Path(driver.instance).is_dir()
    driver.unprepare()
    assert not Path(driver.instance).exists()
    assert (fake.base / "svc" / SUPERVISOR).is_dir()  # the daemon is in it until it exits


def test_unprepare_keeps_an_instance_that_was_there(tmp_path: Path) -> None:
    _, driver = setup(tmp_path)
    driver.preflight()
    again = evolve(driver, made=[])  # a restart on the same root finds it
    again.preflight()
    again.unprepare()
    assert Path(driver.instance).is_dir()


def test_preflight_needs_root(tmp_path: Path) -> None:
    _, driver = setup(tmp_path, euid=1000)
    with pytest.raises(IsolationUnavailable, match="needs root"):
        driver.preflight()


def test_preflight_names_missing_controllers(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    write(fake.base / "svc" / "cgroup.controllers", "memory io")
    assert driver.problem() == (
        f"cgroup2: controllers cpu pids not delegated to {fake.base / 'svc'} (available: memory io)"
    )
    with pytest.raises(IsolationUnavailable, match="controllers cpu pids not delegated"):
        driver.preflight()
    write(fake.base / "svc" / "cgroup.controllers", "")
    assert driver.problem() is not None and driver.problem().endswith("(available: none)")  # type: ignore[union-attr]


def test_problem_when_the_cgroup_does_not_exist(tmp_path: Path) -> None:
    fake, _ = setup(tmp_path)
    driver = Cgroup2Driver.locate(
        mounts(fake.base), {UNIFIED: "/gone"}, None, STATE, fake.clock, fake.kernel()
    )
    assert "cannot read" in (driver.problem() or "")


def test_preflight_fails_when_a_process_cannot_be_moved(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    stuck = fake.spawn(fake.base / "svc")
    leaf_procs = str(fake.base / "svc" / SUPERVISOR / "cgroup.procs")
    real_write = fake.kernel().write

    def refuse(path: str, text: str) -> None:
        if path == leaf_procs and text == str(stuck):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_write(path, text)

    driver = evolve(driver, kernel=evolve(driver.kernel, write=refuse))
    with pytest.raises(IsolationUnavailable) as caught:
        driver.preflight()
    message = str(caught.value)
    assert f"cannot move process {stuck}" in message
    assert "Delegate=yes" in message and "SANDBOXD_CGROUP_ROOT" in message
    assert "\n" not in message


def test_preflight_skips_processes_that_exit_while_moving(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    leaving = fake.spawn(fake.base / "svc")
    real_write = fake.kernel().write

    def exits(path: str, text: str) -> None:
        if text == str(leaving):
            fake._die(leaving)
        real_write(path, text)

    evolve(driver, kernel=evolve(driver.kernel, write=exits)).preflight()
    assert not fake.alive(leaving)


def test_preflight_gives_up_when_processes_keep_appearing(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    leaf_procs = str(fake.base / "svc" / SUPERVISOR / "cgroup.procs")
    real_write = fake.kernel().write

    def forks_back(path: str, text: str) -> None:
        real_write(path, text)
        if path == leaf_procs:
            fake.spawn(fake.base / "svc")

    with pytest.raises(IsolationUnavailable, match="processes keep appearing"):
        evolve(driver, kernel=evolve(driver.kernel, write=forks_back)).preflight()


def test_preflight_leaves_the_real_root_cgroup_populated(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path, own="/")
    driver.preflight()
    assert fake.members[fake.pid][str(fake.base)] == str(fake.base)
    assert (fake.base / "cgroup.subtree_control").read_text().split() == ["memory", "cpu", "pids"]


def test_preflight_with_a_cgroup_root_holding_processes_says_so(tmp_path: Path) -> None:
    fake, _ = setup(tmp_path)
    driver = Cgroup2Driver.locate(
        mounts(fake.base), {}, str(fake.base / "svc"), STATE, fake.clock, fake.kernel()
    )
    with pytest.raises(IsolationUnavailable, match="it holds processes"):
        driver.preflight()
    assert fake.members[fake.pid][str(fake.base)] == str(fake.base / "svc")  # not moved


def test_preflight_reports_other_enable_errors(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    control = str(fake.base / "svc" / "cgroup.subtree_control")
    fake.fail[control] = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(IsolationUnavailable, match=r"cannot enable memory cpu pids .*Permission"):
        driver.preflight()


def test_preflight_reports_an_instance_it_cannot_create(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    fake.fail[driver.instance] = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(IsolationUnavailable, match=r"cannot create .*Permission denied"):
        driver.preflight()


# Sandboxes


def test_create_writes_the_limits(tmp_path: Path) -> None:
    _, driver = ready(tmp_path)
    box = Path(driver.instance) / RID
    assert (box / "memory.max").read_text() == str(50 << 20)
    assert (box / "memory.swap.max").read_text() == "0"
    assert (box / "cpu.max").read_text() == "20000 100000"
    assert (box / "pids.max").read_text() == "20"
    assert driver.join_files(RID) == (str(box / "cgroup.procs"),)
    assert driver.leftovers() == [RID]


def test_create_without_swap_accounting(tmp_path: Path) -> None:
    _, driver = ready(tmp_path, has_swap=False)
    assert not (Path(driver.instance) / RID / "memory.swap.max").exists()


def test_create_undoes_itself_when_a_limit_is_refused(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    driver.preflight()
    box = Path(driver.instance) / RID
    fake.fail[str(box / "cpu.max")] = OSError(errno.EINVAL, "Invalid argument")
    with pytest.raises(OSError, match="Invalid argument"):
        driver.create(RID, LIMITS)
    assert not box.exists()


def test_create_refuses_bad_ids_and_existing_cgroups(tmp_path: Path) -> None:
    _, driver = ready(tmp_path)
    with pytest.raises(ValueError):
        driver.create("../../escape", LIMITS)
    with pytest.raises(FileExistsError):
        driver.create(RID, LIMITS)
    assert (Path(driver.instance) / RID).is_dir()


def test_kill_uses_cgroup_kill_and_waits_until_empty(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path, death_delay=0.02)
    box = Path(driver.instance) / RID
    pids = [fake.spawn(box) for _ in range(3)]
    settle(fake.clock, driver.kill(RID))
    assert not any(fake.alive(p) for p in pids)
    assert (str(box / "cgroup.kill"), "1") in fake.writes
    driver.remove(RID)
    assert not box.exists()
    assert driver.leftovers() == []


def test_kill_freezes_signals_and_thaws_without_cgroup_kill(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path, has_kill=False)
    box = Path(driver.instance) / RID
    pids = [fake.spawn(box) for _ in range(2)]
    settle(fake.clock, driver.kill(RID))
    assert not any(fake.alive(p) for p in pids)
    ours = [(Path(p).name, t) for p, t in fake.writes if Path(p).parent == box]
    assert ours[-2:] == [("cgroup.freeze", "1"), ("cgroup.freeze", "0")]
    assert sorted(fake.signalled) == pids


def test_kill_sweeps_again_when_a_process_forks_during_the_kill(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path, has_kill=False, respawn=2, death_delay=0.005)
    box = Path(driver.instance) / RID
    fake.spawn(box)
    fake.clock.advance(0)
    settle(fake.clock, driver.kill(RID))
    assert (box / "cgroup.procs").read_text() == ""
    assert len(fake.signalled) >= 3


def test_kill_of_a_missing_cgroup_is_immediate(tmp_path: Path) -> None:
    _, driver = setup(tmp_path)
    results: list[object] = []
    driver.kill(RID).addBoth(results.append)
    assert results == [None]


def test_kill_gives_up_after_the_grace_period(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    stubborn = fake.spawn(Path(driver.instance) / RID)
    fake.immortal.add(stubborn)
    driver.kill_timeout = 2.0
    with pytest.raises(StillPopulated, match=r"still has processes after 2\.0s"):
        settle(fake.clock, driver.kill(RID))
    assert fake.signalled.count(stubborn) > 5


def test_remove_of_a_missing_cgroup_is_fine_and_of_a_busy_one_raises(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    fake.spawn(Path(driver.instance) / RID)
    with pytest.raises(OSError, match="busy"):
        driver.remove(RID)
    _, other = setup(tmp_path / "other")
    other.remove(RID)


def test_stats(tmp_path: Path) -> None:
    _, driver = ready(tmp_path)
    box = Path(driver.instance) / RID
    write(box / "memory.current", "1000")
    write(box / "memory.peak", "5000")
    write(box / "cpu.stat", "usage_usec 777\nuser_usec 700")
    write(box / "pids.current", "3")
    write(box / "memory.events", "low 0\noom 1\noom_kill 1")
    assert driver.stats(RID) == CgroupStats(1000, 5000, 777, 3, 1)
    (box / "memory.peak").unlink()
    assert driver.stats(RID).memory_peak_bytes == 1000


def test_leftovers_lists_only_sandbox_directories(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    assert driver.leftovers() == []
    driver.preflight()
    instance = Path(driver.instance)
    (instance / "not-a-rid").mkdir()
    write(instance / "fedcba9876543210", "a file, not a cgroup")
    fake.mkdir(str(instance / "00000000000000ff"))
    assert driver.leftovers() == ["00000000000000ff"]


def test_remove_instance_only_when_empty(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    driver.remove_instance()  # a sandbox is still there: kept
    assert Path(driver.instance).is_dir()
    driver.remove(RID)
    driver.remove_instance()
    assert not Path(driver.instance).exists()
    driver.remove_instance()
    fake.fail[driver.instance] = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(PermissionError):
        driver.remove_instance()


def test_freeze_and_thaw_wait_for_the_kernel(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    box = Path(driver.instance) / RID
    assert settle(fake.clock, driver.freeze(RID, True)) is True
    assert "frozen 1" in (box / "cgroup.events").read_text()
    assert settle(fake.clock, driver.freeze(RID, False)) is True
    assert "frozen 0" in (box / "cgroup.events").read_text()
