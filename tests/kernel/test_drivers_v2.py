"""Real-kernel tests of the cgroup v2 driver: the shared behaviour suite, plus v2 specifics.

Runs as root where this process sits on a pure cgroup v2 hierarchy whose cgroup delegates
``memory cpu pids`` (the VM of ``tests/vm/run.sh``, where pytest is the only process of the
delegated cgroup, as under systemd ``Delegate=yes``); skipped anywhere else. The first bundle
moves the test process into ``<D>/sandboxd-supervisor``, as the daemon would move itself.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.isolation.cgroups.cgroup2 import SUPERVISOR, Cgroup2Driver
from tests.kernel.test_drivers_v1 import LIMITS, Bundle, DriverBehaviour, make_bundle

pytestmark = pytest.mark.kernel


class TestCgroup2(DriverBehaviour):
    """The behaviour suite on the unified hierarchy."""

    mode = "cgroup2"

    @pytest.fixture
    def bundle(self) -> Iterator[Bundle]:
        yield from make_bundle("cgroup2")

    def test_the_daemon_lives_in_a_leaf_beside_its_sandboxes(self, bundle: Bundle) -> None:
        driver = bundle.isolation.cgroups
        assert isinstance(driver, Cgroup2Driver)
        own = Path("/proc/self/cgroup").read_text().strip()
        assert own.endswith(f"/{SUPERVISOR}")
        delegated = Path(driver.delegated)
        assert (delegated / "cgroup.procs").read_text() == ""
        for where in (delegated, Path(driver.instance)):
            enabled = (where / "cgroup.subtree_control").read_text().split()
            assert {"memory", "cpu", "pids"} <= set(enabled)

    def test_limits_are_written(self, bundle: Bundle) -> None:
        rid, _ = bundle.sandbox()
        box = Path(bundle.isolation.cgroups.join_files(rid)[0]).parent
        assert int((box / "memory.max").read_text()) == LIMITS.memory_bytes
        if (box / "memory.swap.max").exists():
            assert (box / "memory.swap.max").read_text().strip() == "0"
        assert (box / "cpu.max").read_text().split() == ["20000", "100000"]
        assert (box / "pids.max").read_text().strip() == "20"
