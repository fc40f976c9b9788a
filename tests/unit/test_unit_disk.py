"""The disk layer's choices and refusals that need no special filesystem.

The limits themselves are tried for real on loop-mounted filesystems: btrfs in
``tests/kernel/test_disk_limits.py``, ext4/XFS project quotas in
``tests/kernel/test_disk_project_quota.py`` (in the VM).
"""

import os
import threading
from pathlib import Path

import pytest

from sandboxd import boot
from sandboxd.config import Config, ConfigError
from sandboxd.core.layout import Layout
from sandboxd.isolation.base import Identity
from sandboxd.isolation.disk import project_ioctl, select
from sandboxd.isolation.disk.base import NO_USAGE, DiskLimits, DiskUnavailable
from sandboxd.isolation.disk.btrfs import FILE_BYTES, byte_budget, quota_mode
from sandboxd.isolation.disk.plain import NoDiskLimits
from sandboxd.isolation.disk.project import ProjectQuotas


def test_limits_are_read_as_sizes_and_counts() -> None:
    config = Config.load({"SANDBOXD_DISK_MAX": "1G", "SANDBOXD_FILES_MAX": "5000"})
    assert (config.disk_max, config.files_max) == (1 << 30, 5000)
    unset = Config.load({"SANDBOXD_DISK_MAX": " "})
    assert (unset.disk_max, unset.files_max) == (None, None)


@pytest.mark.parametrize("name", ["SANDBOXD_DISK_MAX", "SANDBOXD_FILES_MAX"])
def test_a_zero_limit_is_refused_naming_the_variable(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Config.load({name: "0"})


def test_without_limits_sandboxes_get_plain_directories(tmp_path: Path) -> None:
    disk = select.build_disk(str(tmp_path), DiskLimits(None, None))
    assert isinstance(disk, NoDiskLimits) and not disk.enforcing
    layout = Layout(str(tmp_path), owns_files=False)
    layout.create("0123456789abcdef", Identity(1000, 1000), disk)
    assert disk.usage(layout.directory("0123456789abcdef")) == NO_USAGE
    assert disk.charged(lambda: 7)() == 7
    assert disk.sweep(os.path.exists) == 0
    layout.destroy("0123456789abcdef", disk)
    assert os.listdir(tmp_path) == []


def test_a_limit_the_filesystem_cannot_enforce_stops_start_up(tmp_path: Path) -> None:
    # The test's own filesystem: ext4 without project quotas on the hosts (whose kernel has
    # none), an overlay or tmpfs in the VM.
    with pytest.raises(DiskUnavailable, match="disk: ") as caught:
        select.build_disk(str(tmp_path), DiskLimits(1 << 20, None))
    assert str(tmp_path) in str(caught.value)


def test_unknown_filesystems_are_named_by_their_magic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(project_ioctl, "filesystem_type", lambda path: 0x12345678)
    assert select.filesystem_name("/") == "0x12345678"
    with pytest.raises(DiskUnavailable, match="is on 0x12345678, which cannot enforce"):
        select.build_disk("/", DiskLimits(None, 10))


def test_start_up_fails_at_the_disk_step(tmp_path: Path) -> None:
    config = Config.load({"SANDBOXD_DISK_MAX": "1M"})
    with pytest.raises(SystemExit, match="start-up failed at disk: disk: "):
        boot.start_disk(config, Layout(str(tmp_path), owns_files=False))


def test_the_btrfs_byte_budget() -> None:
    assert byte_budget(DiskLimits(5 << 20, 100)) == 5 << 20
    assert byte_budget(DiskLimits(None, 100)) == 100 * FILE_BYTES


def test_btrfs_quota_modes(tmp_path: Path) -> None:
    sysfs = tmp_path / "qgroups"
    assert quota_mode(str(sysfs)) is None  # quotas off: no qgroups directory
    sysfs.mkdir()
    assert quota_mode(str(sysfs)) == "qgroup"  # a kernel from before simple quotas
    (sysfs / "mode").write_text("squota\n")
    assert quota_mode(str(sysfs)) == "squota"


def test_project_quotas_refused_where_they_are_off(tmp_path: Path) -> None:
    for name, mount in (("ext4", "prjquota"), ("xfs", "pquota")):
        with pytest.raises(DiskUnavailable, match=f"{name} project quotas are not on.*{mount}"):
            ProjectQuotas.open(str(tmp_path), DiskLimits(1 << 20, None), name)


def _effective_sys_resource() -> bool:
    """Whether the calling thread has ``CAP_SYS_RESOURCE`` in its effective set."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << project_ioctl.CAP_SYS_RESOURCE))
    raise AssertionError("no CapEff line")


def test_file_work_runs_without_cap_sys_resource_and_gets_it_back() -> None:
    quotas = ProjectQuotas("/", DiskLimits(1, None), root_fd=-1, name="ext4")
    seen: list[tuple[bool, bool, bool]] = []

    def work() -> bool:
        return _effective_sys_resource()

    def thread() -> None:
        before = _effective_sys_resource()
        inside = quotas.charged(work)()
        seen.append((before, inside, _effective_sys_resource()))

    runner = threading.Thread(target=thread)
    runner.start()
    runner.join()
    ((before, inside, after),) = seen
    assert inside is False
    assert after == before  # given back where it was held (root with the capability)
    assert quotas.sweep(os.path.exists) == 0
