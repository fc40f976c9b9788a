"""btrfs: a subvolume per sandbox, limited by a simple-quota qgroup of its own.

Each sandbox directory ``{root}/{rid}`` is a subvolume (``BTRFS_IOC_SUBVOL_CREATE_V2``) made a
member of a level-1 qgroup ``1/<subvolume id>`` whose referenced bytes are limited. Simple
quotas (``squota``, Linux 6.7) are required, not full qgroups: under simple quotas a subvolume
or snapshot the sandbox makes itself inside its directory (any user may) joins its parent's
level-1 qgroup, so it is charged to the same limit; under full qgroups it would start a qgroup
of its own, unlimited. Start-up enables simple quotas on a filesystem that has none, and
refuses one whose qgroups are in full mode.

btrfs has no inode table to exhaust: a file costs the metadata it takes, and that is charged to
the qgroup, so the byte limit also bounds the number of files. With only a files limit, the
byte limit is :data:`FILE_BYTES` per file.
"""

import errno
import os
from collections.abc import Callable
from contextlib import suppress
from typing import TypeVar

from attrs import define
from twisted.logger import Logger

from sandboxd.isolation.base import Identity
from sandboxd.isolation.disk import btrfs_ioctl as ioctl
from sandboxd.isolation.disk.base import DiskLimits, DiskUnavailable, DiskUsage, RemoveTree

T = TypeVar("T")

log = Logger()

FILE_BYTES = 4096
"""Bytes of the qgroup limit per file of ``SANDBOXD_FILES_MAX`` when no byte limit is set."""

PROBE = ".sandboxd-disk-probe"
"""The subvolume start-up makes and removes to prove every step works."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def byte_budget(limits: DiskLimits) -> int:
    """The qgroup's referenced-bytes limit for ``limits``."""
    if limits.bytes is not None:
        return limits.bytes
    assert limits.files is not None, "no limit: no driver"
    return limits.files * FILE_BYTES


def quota_mode(sysfs: str) -> str | None:
    """``squota``, ``qgroup`` (full), or ``None`` when quotas are off."""
    try:
        with open(os.path.join(sysfs, "mode")) as f:
            return f.read().strip()
    except FileNotFoundError:
        return "qgroup" if os.path.isdir(sysfs) else None


@define
class BtrfsQuotas:
    """The btrfs disk driver of one state root (its descriptor kept open)."""

    root: str
    limits: DiskLimits
    root_fd: int
    sysfs: str
    """``/sys/fs/btrfs/<uuid>/qgroups``: usage and limits of every qgroup."""
    name: str = "btrfs"

    @classmethod
    def open(cls, root: str, limits: DiskLimits) -> "BtrfsQuotas":
        """The driver for ``root`` on btrfs: simple quotas checked (enabled if off) and a
        probe subvolume made, limited and removed; ``DiskUnavailable`` naming what failed."""
        fd = os.open(root, _DIR)
        try:
            sysfs = f"/sys/fs/btrfs/{ioctl.filesystem_uuid(fd)}/qgroups"
            mode = quota_mode(sysfs)
            if mode == "qgroup":
                raise DiskUnavailable(
                    f"disk: btrfs quotas on {root} are full qgroups, under which a subvolume a"
                    " sandbox makes itself escapes its limit; run `btrfs quota disable` on the"
                    " filesystem and start again (sandboxd then enables simple quotas)"
                )
            if mode is None:
                try:
                    ioctl.quota_ctl(fd, ioctl.QUOTA_ENABLE_SIMPLE)
                except OSError as e:
                    raise DiskUnavailable(
                        f"disk: cannot enable btrfs simple quotas on {root} ({e.strerror});"
                        " they need Linux 6.7 or later"
                    ) from None
                log.info("disk: enabled btrfs simple quotas on {root}", root=root)
            driver = cls(root, limits, fd, sysfs)
            driver.probe()
        except BaseException:
            os.close(fd)
            raise
        return driver

    def probe(self) -> None:
        """Make, limit and remove one subvolume: the steps of every create and kill."""
        path = os.path.join(self.root, PROBE)
        self.destroy(path, _no_tree)  # a crashed predecessor's probe
        try:
            self.make_directory(path, Identity(0, 0))
            self.usage(path)
            self.destroy(path, _no_tree)
        except OSError as e:
            with suppress(OSError):  # what the failed step left
                self.destroy(path, _no_tree)
            problem = f"disk: btrfs subvolume with a qgroup on {self.root}: {e}"
            raise DiskUnavailable(problem) from None

    def charged(self, work: Callable[[], T]) -> Callable[[], T]:
        """The limits hold for the daemon's own writes too: ``work`` as it is."""
        return work

    @property
    def enforcing(self) -> bool:
        return True

    def make_directory(self, path: str, identity: Identity) -> None:
        name = os.path.basename(path)
        ioctl.create_subvolume(self.root_fd, name)
        sid = self._subvolume(path)
        assert sid is not None, f"{path} was just made a subvolume"
        group = ioctl.qgroup_id(1, sid)
        with suppress(FileExistsError):  # a predecessor's, on a remounted filesystem
            ioctl.create_qgroup(self.root_fd, group)
        ioctl.assign_qgroup(self.root_fd, ioctl.qgroup_id(0, sid), group)
        ioctl.limit_qgroup(self.root_fd, group, byte_budget(self.limits))
        os.chmod(path, 0o700)

    def usage(self, path: str) -> DiskUsage:
        sid = self._subvolume(path)
        if sid is None:
            return DiskUsage(None, None, None, None)
        here = os.path.join(self.sysfs, f"1_{sid}")
        return DiskUsage(
            bytes=_read_int(os.path.join(here, "referenced")),
            bytes_limit=_read_int(os.path.join(here, "max_referenced")),
            files=None,
            files_limit=None,
        )

    def destroy(self, path: str, remove_tree: RemoveTree) -> None:
        """Delete the subvolume at once (the kernel frees its extents in the background), then
        its qgroup. A directory holding subvolumes of the sandbox's own is emptied file by file
        first (a read-only one, which cannot be emptied, is deleted whole); a plain directory
        (made before limits were on) is removed as such."""
        try:
            sid = self._subvolume(path)
        except FileNotFoundError:
            return
        if sid is None:
            remove_tree(path)
            return
        try:
            ioctl.destroy_subvolume(self.root_fd, os.path.basename(path))
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
            remove_tree(path)  # rmdir of each (emptied) nested subvolume deletes it
            if os.path.lexists(path):
                _destroy_nested(path)  # read-only ones, which no file removal can empty
                ioctl.destroy_subvolume(self.root_fd, os.path.basename(path))
        self._remove_group(sid)

    def sweep(self, live: Callable[[str], bool]) -> int:
        """Remove every empty level-1 qgroup whose subvolume is gone (a crash between a
        subvolume's deletion and its qgroup's)."""
        removed = 0
        for entry in _listdir(self.sysfs):
            level, _, sid = entry.partition("_")
            if level != "1" or not sid.isdigit() or os.path.exists(f"{self.sysfs}/0_{sid}"):
                continue
            try:
                ioctl.remove_qgroup(self.root_fd, ioctl.qgroup_id(1, int(sid)))
            except OSError as e:
                log.warn("disk: stale qgroup 1/{sid} kept: {why}", sid=sid, why=e.strerror)
                continue
            removed += 1
        return removed

    def _subvolume(self, path: str) -> int | None:
        """The id of the subvolume whose top directory is ``path``, ``None`` for a plain
        directory; ``FileNotFoundError`` when there is none."""
        fd = os.open(path, _DIR)
        try:
            if os.fstat(fd).st_ino != ioctl.FIRST_FREE_OBJECTID:
                return None
            return ioctl.subvolume_id(fd)
        finally:
            os.close(fd)

    def _remove_group(self, sid: int) -> None:
        group = ioctl.qgroup_id(1, sid)
        with suppress(FileNotFoundError):
            ioctl.assign_qgroup(self.root_fd, ioctl.qgroup_id(0, sid), group, assign=False)
        try:
            ioctl.remove_qgroup(self.root_fd, group)
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            # Other members: the subvolumes the sandbox made itself (already deleted).
            for entry in _listdir(self.sysfs):
                level, _, member = entry.partition("_")
                if level == "0" and member.isdigit():
                    with suppress(FileNotFoundError):
                        child = ioctl.qgroup_id(0, int(member))
                        ioctl.assign_qgroup(self.root_fd, child, group, assign=False)
            ioctl.remove_qgroup(self.root_fd, group)


def _destroy_nested(path: str) -> None:
    """Delete every subvolume below ``path``, the deepest first, by descriptor (no symlink
    is followed); what they hold goes with them."""
    for _, names, _, dir_fd in os.fwalk(path, topdown=False):
        for name in names:
            inode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino
            if inode == ioctl.FIRST_FREE_OBJECTID:
                ioctl.destroy_subvolume(dir_fd, name)


def _no_tree(path: str) -> None:
    """The probe holds no files: nothing to remove one by one."""


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
