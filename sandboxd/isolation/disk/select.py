"""Choose the disk driver from the state root's filesystem, or refuse to start in one line."""

import os

from twisted.logger import Logger

from sandboxd.isolation.disk import project_ioctl
from sandboxd.isolation.disk.base import DiskDriver, DiskLimits, DiskUnavailable
from sandboxd.isolation.disk.btrfs import BtrfsQuotas
from sandboxd.isolation.disk.btrfs_ioctl import SUPER_MAGIC as BTRFS_MAGIC
from sandboxd.isolation.disk.plain import NoDiskLimits
from sandboxd.isolation.disk.project import ProjectQuotas

log = Logger()

FILESYSTEMS = {
    BTRFS_MAGIC: "btrfs",
    project_ioctl.EXT4_SUPER_MAGIC: "ext4",
    project_ioctl.XFS_SUPER_MAGIC: "xfs",
    0x01021994: "tmpfs",
    0x794C7630: "overlayfs",
}


def filesystem_name(root: str) -> str:
    """The name of the filesystem holding ``root`` (``0x…`` for one not known here)."""
    magic = project_ioctl.filesystem_type(root)
    return FILESYSTEMS.get(magic, f"{magic:#x}")


def build_disk(root: str, limits: DiskLimits) -> DiskDriver:
    """The driver enforcing ``limits`` on the state root ``root`` (which exists); with no limit
    configured, plain directories. ``DiskUnavailable`` names the filesystem when it cannot."""
    if not limits.any:
        return NoDiskLimits()
    fs = filesystem_name(root)
    driver: DiskDriver
    if fs == "btrfs":
        driver = BtrfsQuotas.open(root, limits)
    elif fs in ("ext4", "xfs"):
        driver = ProjectQuotas.open(root, limits, fs)
    else:
        raise DiskUnavailable(
            f"disk: SANDBOXD_DISK_MAX/SANDBOXD_FILES_MAX are set but {root} is on {fs}, which"
            " cannot enforce them (btrfs, or ext4/XFS with project quotas, can; unset both to"
            " run without disk limits)"
        )
    swept = driver.sweep(os.path.exists)
    if swept:
        log.info("disk: removed {count} stale quota groups", count=swept)
    return driver
