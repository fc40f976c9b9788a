"""CPU placement (``sandboxd.isolation.cgroups.placement``) and the drivers' use of it, against
the fake cgroup filesystem (the real kernel: ``tests/kernel/test_drivers_v1.py``)."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxd.isolation.base import Limits
from sandboxd.isolation.cgroups.cgroup1 import Cgroup1Driver
from sandboxd.isolation.cgroups.cgroup2 import Cgroup2Driver
from sandboxd.isolation.cgroups.hierarchy import Mount
from sandboxd.isolation.cgroups.placement import (
    CpuPlacement,
    cpus_for,
    format_cpu_list,
    parse_cpu_list,
)
from sandboxd.isolation.naming import instance_name
from tests.isolation.test_isolation_cgroup1 import setup as setup_v1
from tests.support.kernel_fakes import FakeKernel, write

STATE = "/srv/sandboxes"
ONE = Limits(memory_bytes=None, cpu_cores=1.0, pids=None)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3", (0, 1, 2, 3)), ("0,2-3\n", (0, 2, 3)), ("5", (5,)), ("", ()), ("\n", ())],
)
def test_a_kernel_cpu_list_is_read(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


@given(st.sets(st.integers(0, 255), min_size=1))
def test_a_cpu_list_reads_back(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(tuple(sorted(cpus)))) == tuple(sorted(cpus))


@pytest.mark.parametrize(
    ("cores", "covered"), [(0.2, 1), (1.0, 1), (1.01, 2), (2.5, 3), (4.0, 4), (9.0, 4), (None, 4)]
)
def test_a_quota_covers_the_cpus_it_rounds_up_to(cores: float | None, covered: int) -> None:
    assert cpus_for(cores, 4) == covered


def test_sandboxes_go_to_the_cpus_the_fewest_hold() -> None:
    placement = CpuPlacement((0, 1, 2, 3))
    assert placement.take("a", 1.0) == (0,)
    assert placement.take("b", 2.0) == (1, 2)
    assert placement.take("c", 1.0) == (3,)
    assert placement.take("d", 2.0) == (0, 1)  # held by one each; the lowest numbers
    assert placement.take("e", None) == (0, 1, 2, 3)  # unlimited: everywhere
    placement.give_back("b")
    assert placement.take("f", 1.5) == (1, 2)  # held by 2 and 1 (a, d, e; c, e; e)
    placement.give_back("no such sandbox")
    assert set(placement.held) == {"a", "c", "d", "e", "f"}


@given(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), max_size=40))
def test_without_removals_no_cpu_holds_two_sandboxes_more_than_another(
    quotas: list[float],
) -> None:
    placement = CpuPlacement((0, 1, 2, 3))
    for n, cores in enumerate(quotas):
        placement.take(str(n), cores)
    held = [sum(cpu in cpus for cpus in placement.held.values()) for cpu in range(4)]
    assert max(held) - min(held) <= 1


# The v1 driver


def test_v1_sandboxes_are_spread_over_the_cpus_and_give_them_back(tmp_path: Path) -> None:
    fake, driver = setup_v1(tmp_path, ("memory", "cpu,cpuacct", "pids", "cpuset"))
    assert driver.place_cpus() is None
    driver.preflight()
    instance = fake.base / "cpuset" / instance_name(STATE)
    assert (instance / "cpuset.cpus").read_text() == "0,1,2,3"
    assert (instance / "cpuset.mems").read_text() == "0"
    driver.create("0" * 16, ONE)
    driver.create("1" * 16, ONE)
    assert (instance / ("0" * 16) / "cpuset.cpus").read_text() == "0"
    assert (instance / ("1" * 16) / "cpuset.cpus").read_text() == "1"
    assert (instance / ("1" * 16) / "cpuset.mems").read_text() == "0"
    assert driver.stats("1" * 16).cpus == (1,)
    assert str(instance / ("1" * 16) / "tasks") in driver.join_files("1" * 16)
    driver.remove("0" * 16)
    driver.create("2" * 16, ONE)
    assert (instance / ("2" * 16) / "cpuset.cpus").read_text() == "0"


def test_v1_a_create_that_fails_gives_its_cpus_back(tmp_path: Path) -> None:
    fake, driver = setup_v1(tmp_path, ("memory", "cpu,cpuacct", "pids", "cpuset"))
    driver.place_cpus()
    driver.preflight()
    box = fake.base / "cpuset" / instance_name(STATE) / ("0" * 16)
    fake.fail[str(box / "cpuset.cpus")] = OSError(28, "No space left on device")
    with pytest.raises(OSError):
        driver.create("0" * 16, ONE)
    assert not box.exists()
    assert driver.placement is not None and driver.placement.held == {}


def test_v1_without_placement_the_cpuset_hierarchy_is_left_alone(tmp_path: Path) -> None:
    fake, driver = setup_v1(tmp_path, ("memory", "cpu,cpuacct", "pids", "cpuset"))
    driver.preflight()
    driver.create("0" * 16, ONE)
    assert not (fake.base / "cpuset" / instance_name(STATE)).exists()
    assert not any("cpuset" in path for path in driver.join_files("0" * 16))
    assert driver.stats("0" * 16).cpus is None


def test_v1_a_successor_without_placement_removes_what_a_placing_one_left(
    tmp_path: Path,
) -> None:
    fake, placing = setup_v1(tmp_path, ("memory", "cpu,cpuacct", "pids", "cpuset"))
    placing.place_cpus()
    placing.preflight()
    placing.create("0" * 16, ONE)
    instance = fake.base / "cpuset" / instance_name(STATE)
    successor = Cgroup1Driver(placing.delegated, placing.instance, fake.clock, fake.kernel())
    successor.preflight()
    assert successor.leftovers() == ["0" * 16]
    successor.remove("0" * 16)
    assert not (instance / ("0" * 16)).exists()
    successor.remove_instance()
    assert not instance.exists()


def test_v1_placement_needs_a_cpuset_hierarchy_with_cpus(tmp_path: Path) -> None:
    _, driver = setup_v1(tmp_path, ("memory", "cpu,cpuacct", "pids"))
    assert driver.place_cpus() == "cgroup1: no cpuset hierarchy holds the daemon's cgroup"
    fake, driver = setup_v1(tmp_path / "empty", ("memory", "cpu,cpuacct", "pids", "cpuset"))
    write(fake.base / "cpuset" / "cpuset.effective_cpus", "\n")
    assert driver.place_cpus() == f"cgroup1: {fake.base / 'cpuset'} has no CPU"
    (fake.base / "cpuset" / "cpuset.effective_mems").unlink()
    write(fake.base / "cpuset" / "cpuset.effective_cpus", "0-1")
    assert "cannot read the memory nodes" in (driver.place_cpus() or "")
    (fake.base / "cpuset" / "cpuset.effective_cpus").unlink()
    assert "cannot read the CPUs" in (driver.place_cpus() or "")
    assert driver.placement is None


# The v2 driver


def setup_v2(tmp_path: Path, controllers: str) -> tuple[FakeKernel, Cgroup2Driver]:
    fake = FakeKernel(tmp_path / "cg", 2)
    fake.make_root()
    delegated = fake.base / "d"
    fake.make_cgroup(delegated, controllers)
    write(delegated / "cpuset.cpus.effective", "0-1")
    mounts = [Mount("/", str(fake.base), "cgroup2", frozenset(["rw"]))]
    driver = Cgroup2Driver.locate(mounts, {"": "/d"}, "/d", STATE, fake.clock, fake.kernel())
    return fake, driver


def test_v2_sandboxes_are_spread_over_the_cpus_and_give_them_back(tmp_path: Path) -> None:
    fake, driver = setup_v2(tmp_path, "memory cpu pids cpuset")
    assert driver.place_cpus() is None
    driver.preflight()
    instance = Path(driver.instance)
    for where in (fake.base / "d", instance):
        assert "cpuset" in (where / "cgroup.subtree_control").read_text().split()
    driver.create("0" * 16, ONE)
    driver.create("1" * 16, Limits(memory_bytes=None, cpu_cores=0.5, pids=None))
    driver.create("2" * 16, Limits(memory_bytes=None, cpu_cores=None, pids=None))
    assert [(instance / (n * 16) / "cpuset.cpus").read_text() for n in "012"] == [
        "0",
        "1",
        "0,1",
    ]
    assert driver.stats("2" * 16).cpus == (0, 1)
    driver.remove("1" * 16)
    assert driver.placement is not None and set(driver.placement.held) == {"0" * 16, "2" * 16}


def test_v2_a_create_that_fails_gives_its_cpus_back(tmp_path: Path) -> None:
    fake, driver = setup_v2(tmp_path, "memory cpu pids cpuset")
    driver.place_cpus()
    driver.preflight()
    box = Path(driver.instance) / ("0" * 16)
    fake.fail[str(box / "cpuset.cpus")] = OSError(22, "Invalid argument")
    with pytest.raises(OSError):
        driver.create("0" * 16, ONE)
    assert not box.exists()
    assert driver.placement is not None and driver.placement.held == {}


def test_v2_placement_needs_the_cpuset_controller_and_cpus(tmp_path: Path) -> None:
    fake, driver = setup_v2(tmp_path, "memory cpu pids")
    assert driver.place_cpus() == (
        f"cgroup2: the cpuset controller is not delegated to {fake.base / 'd'}"
    )
    driver.preflight()
    assert "cpuset" not in (fake.base / "d" / "cgroup.subtree_control").read_text()
    fake, driver = setup_v2(tmp_path / "empty", "memory cpu pids cpuset")
    write(fake.base / "d" / "cpuset.cpus.effective", "")
    assert driver.place_cpus() == f"cgroup2: {fake.base / 'd'} has no CPU"
    (fake.base / "d" / "cpuset.cpus.effective").unlink()
    assert "cannot read the CPUs" in (driver.place_cpus() or "")
    (fake.base / "d" / "cgroup.controllers").unlink()
    assert driver.place_cpus() == driver.problem() is not None
    assert driver.placement is None
    fake, driver = setup_v2(tmp_path / "few", "cpuset")  # what sandboxes need is missing
    assert driver.place_cpus() == driver.problem() is not None
    assert driver.placement is None
