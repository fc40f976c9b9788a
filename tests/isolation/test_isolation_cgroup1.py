"""The cgroup v1 driver against fake memory, cpu, cpuacct, pids and freezer hierarchies."""

import errno
from pathlib import Path
from typing import Any

import pytest

from sandboxd.isolation.base import CgroupStats, IsolationUnavailable, Limits
from sandboxd.isolation.cgroups.cgroup1 import Cgroup1Driver
from sandboxd.isolation.cgroups.hierarchy import Mount
from sandboxd.isolation.cgroups.polling import StillPopulated
from sandboxd.isolation.naming import instance_name
from tests.support.kernel_fakes import FakeKernel, settle, write

RID = "0123456789abcdef"
LIMITS = Limits(memory_bytes=50 << 20, cpu_cores=0.2, pids=20)
STATE = "/srv/sandboxes"
INSTANCE = instance_name(STATE)
SEPARATE = ("memory", "cpu", "cpuacct", "pids", "freezer")
COMOUNTED = ("memory", "cpu,cpuacct", "pids")


def setup(
    tmp_path: Path,
    hierarchies: tuple[str, ...] = SEPARATE,
    cgroup_root: str | None = None,
    **fake_options: Any,
) -> tuple[FakeKernel, Cgroup1Driver]:
    """v1 hierarchies under ``tmp/v1``; the daemon's memory cgroup is ``/process_api/x``."""
    fake = FakeKernel(tmp_path / "v1", 1, **fake_options)
    fake.make_root(*hierarchies)
    fake.make_cgroup(fake.base / "memory" / "process_api" / "x")
    mounts = [
        Mount("/", str(fake.base / name), "cgroup", frozenset(["rw", *name.split(",")]))
        for name in hierarchies
    ]
    mounts.append(Mount("/", str(tmp_path / "unified"), "cgroup2", frozenset(["rw"])))
    own = {c: "/" for name in hierarchies for c in name.split(",")}
    own["memory"] = "/process_api/x"
    driver = Cgroup1Driver.locate(mounts, own, cgroup_root, STATE, fake.clock, fake.kernel())
    return fake, driver


def ready(tmp_path: Path, **options: object) -> tuple[FakeKernel, Cgroup1Driver]:
    fake, driver = setup(tmp_path, **options)  # type: ignore[arg-type]
    driver.preflight()
    driver.create(RID, LIMITS)
    return fake, driver


def boxes(fake: FakeKernel, hierarchies: tuple[str, ...] = SEPARATE) -> list[Path]:
    """The sandbox's cgroup in each hierarchy."""
    found = []
    for name in hierarchies:
        parent = fake.base / name / ("process_api/x" if name == "memory" else "")
        found.append(parent / INSTANCE / RID)
    return found


def test_locate_finds_each_hierarchy_under_our_own_cgroup(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    assert driver.delegated == {
        "memory": str(fake.base / "memory" / "process_api" / "x"),
        "cpu": str(fake.base / "cpu"),
        "pids": str(fake.base / "pids"),
        "cpuacct": str(fake.base / "cpuacct"),
        "freezer": str(fake.base / "freezer"),
    }
    assert driver.instance == INSTANCE and driver.name == "cgroup1"


def test_locate_with_a_cgroup_root_uses_it_in_every_hierarchy(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path, cgroup_root="/sandboxd")
    assert set(driver.delegated.values()) == {
        str(fake.base / name / "sandboxd") for name in SEPARATE
    }


def test_locate_refuses_missing_hierarchies(tmp_path: Path) -> None:
    with pytest.raises(IsolationUnavailable, match="no cpu pids hierarchy is mounted"):
        setup(tmp_path, hierarchies=("memory",))


def test_locate_refuses_a_required_cgroup_the_mount_does_not_show(tmp_path: Path) -> None:
    mounts = [
        Mount("/", str(tmp_path / c), "cgroup", frozenset([c])) for c in ("memory", "cpu", "pids")
    ]
    mounts.append(Mount("/hidden", str(tmp_path / "freezer"), "cgroup", frozenset(["freezer"])))
    own = {"memory": "/", "cpu": "/", "freezer": "/"}
    with pytest.raises(IsolationUnavailable, match="cannot place cgroup None in the pids"):
        Cgroup1Driver.locate(mounts, own, None, STATE, None, None)  # type: ignore[arg-type]
    own["pids"] = "/"
    driver = Cgroup1Driver.locate(mounts, own, None, STATE, None, None)  # type: ignore[arg-type]
    assert "freezer" not in driver.delegated  # optional, and not visible: done without


def test_preflight_creates_the_instance_in_every_hierarchy(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    driver.preflight()
    driver.preflight()
    for box in boxes(fake):
        assert box.parent.is_dir()


def test_unprepare_removes_only_the_instances_preflight_made(tmp_path: Path) -> None:
    """A start-up that stops after the preflight leaves no instance directory behind, but
    never removes one that was there before it (a predecessor's, with its sandboxes)."""
    fake, driver = setup(tmp_path)
    kept = boxes(fake)[1].parent  # cpu: there before this start
    kept.mkdir()
    driver.preflight()
    driver.unprepare()
    assert [box.parent.is_dir() for box in boxes(fake)] == [False, True, False, False, False]
    driver.unprepare()  # nothing left to do
    assert kept.is_dir()


def test_unprepare_leaves_an_instance_in_use_and_reports_other_errors(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    driver.preflight()
    memory = str(boxes(fake)[0].parent)
    fake.fail[memory] = OSError(errno.EBUSY, "Device or resource busy")
    driver.unprepare()  # busy: left
    assert boxes(fake)[0].parent.is_dir() and not boxes(fake)[1].parent.exists()
    driver.made.append(memory)
    fake.fail[memory] = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(PermissionError):
        driver.unprepare()


def test_preflight_needs_root(tmp_path: Path) -> None:
    _, driver = setup(tmp_path, euid=1000)
    with pytest.raises(IsolationUnavailable, match="cgroup1 isolation needs root"):
        driver.preflight()


def test_preflight_refuses_a_missing_delegated_cgroup(tmp_path: Path) -> None:
    _, driver = setup(tmp_path, cgroup_root="/absent")
    with pytest.raises(IsolationUnavailable, match="absent does not exist"):
        driver.preflight()


def test_preflight_refuses_a_subtree_it_cannot_write(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    fake.fail[str(fake.base / "pids" / INSTANCE)] = PermissionError(
        errno.EACCES, "Permission denied"
    )
    with pytest.raises(
        IsolationUnavailable, match=r"cannot create .*Permission denied.*CGROUP_ROOT"
    ):
        driver.preflight()


def test_create_writes_limits_in_each_hierarchy(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    memory, cpu, cpuacct, pids, freezer = boxes(fake)
    assert (memory / "memory.limit_in_bytes").read_text() == str(50 << 20)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(50 << 20)
    assert (memory / "memory.kmem.tcp.limit_in_bytes").read_text() == str(50 << 20)
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "20000"
    assert (pids / "pids.max").read_text() == "20"
    assert cpuacct.is_dir() and freezer.is_dir()
    # tasks, not cgroup.procs: a single thread moving itself skips the global threadgroup lock
    assert sorted(driver.join_files(RID)) == sorted(str(b / "tasks") for b in boxes(fake))
    assert driver.leftovers() == [RID]


def test_socket_buffers_off_leaves_them_uncharged(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    driver.socket_buffers = False
    driver.preflight()
    driver.create(RID, LIMITS)
    memory = boxes(fake)[0]
    assert (memory / "memory.kmem.tcp.limit_in_bytes").read_text() == "9223372036854771712"


def test_preflight_refuses_to_charge_socket_buffers_without_kmem_tcp(tmp_path: Path) -> None:
    _, driver = setup(tmp_path, has_kmem_tcp=False)
    with pytest.raises(IsolationUnavailable, match=r"socket buffers: .*SOCKET_BUFFERS=off"):
        driver.preflight()
    driver.socket_buffers = False
    driver.preflight()


def test_comounted_cpu_and_cpuacct_share_one_directory(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path, hierarchies=COMOUNTED, has_memsw=False)
    memory, cpu, pids = boxes(fake, COMOUNTED)
    assert driver.join_files(RID) == [str(b / "tasks") for b in (memory, cpu, pids)]
    assert not (memory / "memory.memsw.limit_in_bytes").exists()
    write(cpu / "cpuacct.usage", "5000000")
    assert driver.stats(RID).cpu_usec == 5000


def test_create_is_all_or_nothing(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    driver.preflight()
    _, cpu, *_ = boxes(fake)
    fake.fail[str(cpu / "cpu.cfs_quota_us")] = OSError(errno.EINVAL, "Invalid argument")
    with pytest.raises(OSError, match="Invalid"):
        driver.create(RID, LIMITS)
    assert not any(box.exists() for box in boxes(fake))
    with pytest.raises(ValueError):
        driver.create("nope", LIMITS)


def test_kill_freezes_kills_thaws_and_waits_for_every_hierarchy(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path, death_delay=0.01)
    pids = [fake.spawn(*boxes(fake)) for _ in range(3)]
    settle(fake.clock, driver.kill(RID))
    assert not any(fake.alive(p) for p in pids)
    state = str(boxes(fake)[-1] / "freezer.state")
    assert [t for p, t in fake.writes if p == state] == ["FROZEN", "THAWED"]
    for box in boxes(fake):
        assert (box / "cgroup.procs").read_text() == ""
    driver.remove(RID)
    assert not any(box.exists() for box in boxes(fake))


def test_kill_goes_on_when_freezing_does_not_complete(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path, sticky_freeze=True)
    pid = fake.spawn(*boxes(fake))
    settle(fake.clock, driver.kill(RID))
    assert not fake.alive(pid)
    assert fake.clock.seconds() >= 1.0


def test_kill_without_a_freezer_sweeps_until_empty(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path, hierarchies=COMOUNTED, respawn=3, death_delay=0.003)
    pid = fake.spawn(*boxes(fake, COMOUNTED))
    settle(fake.clock, driver.kill(RID))
    assert not fake.alive(pid)
    assert all((b / "cgroup.procs").read_text() == "" for b in boxes(fake, COMOUNTED))
    assert len(fake.signalled) >= 4


def test_kill_of_a_missing_sandbox_is_immediate(tmp_path: Path) -> None:
    _, driver = setup(tmp_path)
    results: list[object] = []
    driver.kill(RID).addBoth(results.append)
    assert results == [None]


def test_kill_gives_up_after_the_grace_period(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    fake.immortal.add(fake.spawn(*boxes(fake)))
    driver.kill_timeout = 1.0
    with pytest.raises(StillPopulated, match=RID):
        settle(fake.clock, driver.kill(RID))


def test_remove_tries_every_hierarchy_and_reports_the_first_failure(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    memory, cpu, *_ = boxes(fake)
    fake.spawn(cpu)
    with pytest.raises(OSError, match="busy"):
        driver.remove(RID)
    assert memory.exists() and cpu.exists()  # memory goes last: found again by leftovers()
    assert not any(box.exists() for box in boxes(fake)[2:])
    assert driver.leftovers() == [RID]
    driver.remove_instance()  # memory's and cpu's are busy, the others go
    assert cpu.parent.exists() and memory.parent.exists()
    assert not boxes(fake)[3].parent.exists()


def test_remove_instance_raises_unexpected_errors(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    driver.preflight()
    fake.fail[str(fake.base / "pids" / INSTANCE)] = PermissionError(errno.EACCES, "denied")
    with pytest.raises(PermissionError):
        driver.remove_instance()


def test_stats(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    memory, _, cpuacct, pids, _ = boxes(fake)
    write(memory / "memory.usage_in_bytes", "1000")
    write(memory / "memory.max_usage_in_bytes", "4000")
    write(memory / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2")
    write(cpuacct / "cpuacct.usage", "3000999")
    write(pids / "pids.current", "4")
    assert driver.stats(RID) == CgroupStats(1000, 4000, 3000, 4, 2)


def test_stats_without_cpuacct_reports_no_cpu_time(tmp_path: Path) -> None:
    _, driver = ready(tmp_path, hierarchies=("memory", "cpu", "pids"))
    assert driver.stats(RID).cpu_usec == 0


def test_leftovers_come_from_the_memory_hierarchy(tmp_path: Path) -> None:
    fake, driver = setup(tmp_path)
    assert driver.leftovers() == []
    driver.preflight()
    memory = fake.base / "memory" / "process_api" / "x" / INSTANCE
    fake.mkdir(str(memory / "00000000000000aa"))
    (memory / "junk").mkdir()
    fake.mkdir(str(fake.base / "cpu" / INSTANCE / "00000000000000bb"))  # another daemon's
    assert driver.leftovers() == ["00000000000000aa"]


def test_freeze_and_thaw_through_the_freezer_hierarchy(tmp_path: Path) -> None:
    fake, driver = ready(tmp_path)
    state = next(Path(fake.base / "freezer").rglob(f"{RID}/freezer.state"))
    assert settle(fake.clock, driver.freeze(RID, True)) is True
    assert state.read_text() == "FROZEN"
    assert settle(fake.clock, driver.freeze(RID, False)) is True
    assert state.read_text() == "THAWED"


def test_freeze_is_refused_without_a_freezer_or_when_it_never_ends(tmp_path: Path) -> None:
    bare, plain = ready(tmp_path / "plain", hierarchies=COMOUNTED)
    assert settle(bare.clock, plain.freeze(RID, True)) is False
    fake, sticky = ready(tmp_path / "sticky", sticky_freeze=True)
    assert settle(fake.clock, sticky.freeze(RID, True)) is False
