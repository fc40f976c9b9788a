"""The btrfs ioctls the btrfs disk driver needs, through ``fcntl.ioctl`` (no ``btrfs`` CLI).

Structures and numbers are those of ``linux/btrfs.h``. Every function takes a directory
descriptor on the filesystem and raises ``OSError`` with the kernel's errno.
"""

import ctypes
import fcntl
import os

_MAGIC = 0x94
_PATH_NAME_MAX = 4087
_VOL_NAME_MAX = 4039
_INO_LOOKUP_PATH_MAX = 4080

QUOTA_ENABLE = 1
QUOTA_ENABLE_SIMPLE = 4
LIMIT_MAX_RFER = 1 << 0
LIMIT_MAX_EXCL = 1 << 1
SUBVOL_SPEC_BY_ID = 1 << 4
FIRST_FREE_OBJECTID = 256
"""The inode number of every subvolume's top directory."""
SUPER_MAGIC = 0x9123683E


def _ioc(direction: int, number: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (_MAGIC << 8) | number


class VolArgs(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int64), ("name", ctypes.c_char * (_PATH_NAME_MAX + 1))]


class QgroupLimit(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("max_rfer", ctypes.c_uint64),
        ("max_excl", ctypes.c_uint64),
        ("rsv_rfer", ctypes.c_uint64),
        ("rsv_excl", ctypes.c_uint64),
    ]


class QgroupInherit(ctypes.Structure):
    """``btrfs_qgroup_inherit`` with room for one qgroup the new subvolume joins."""

    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("num_qgroups", ctypes.c_uint64),
        ("num_ref_copies", ctypes.c_uint64),
        ("num_excl_copies", ctypes.c_uint64),
        ("lim", QgroupLimit),
        ("qgroups", ctypes.c_uint64 * 1),
    ]


class _SizeInherit(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64), ("qgroup_inherit", ctypes.c_void_p)]


class _V2Middle(ctypes.Union):
    _fields_ = [("si", _SizeInherit), ("unused", ctypes.c_uint64 * 4)]


class _V2Name(ctypes.Union):
    _fields_ = [
        ("name", ctypes.c_char * (_VOL_NAME_MAX + 1)),
        ("devid", ctypes.c_uint64),
        ("subvolid", ctypes.c_uint64),
    ]


class VolArgsV2(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_int64),
        ("transid", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("middle", _V2Middle),
        ("tail", _V2Name),
    ]


class QuotaCtlArgs(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_uint64), ("status", ctypes.c_uint64)]


class QgroupAssignArgs(ctypes.Structure):
    _fields_ = [("assign", ctypes.c_uint64), ("src", ctypes.c_uint64), ("dst", ctypes.c_uint64)]


class QgroupCreateArgs(ctypes.Structure):
    _fields_ = [("create", ctypes.c_uint64), ("qgroupid", ctypes.c_uint64)]


class QgroupLimitArgs(ctypes.Structure):
    _fields_ = [("qgroupid", ctypes.c_uint64), ("lim", QgroupLimit)]


class InoLookupArgs(ctypes.Structure):
    _fields_ = [
        ("treeid", ctypes.c_uint64),
        ("objectid", ctypes.c_uint64),
        ("name", ctypes.c_char * _INO_LOOKUP_PATH_MAX),
    ]


class FsInfoArgs(ctypes.Structure):
    _fields_ = [
        ("max_id", ctypes.c_uint64),
        ("num_devices", ctypes.c_uint64),
        ("fsid", ctypes.c_uint8 * 16),
        ("nodesize", ctypes.c_uint32),
        ("sectorsize", ctypes.c_uint32),
        ("clone_alignment", ctypes.c_uint32),
        ("csum_type", ctypes.c_uint16),
        ("csum_size", ctypes.c_uint16),
        ("flags", ctypes.c_uint64),
        ("generation", ctypes.c_uint64),
        ("metadata_uuid", ctypes.c_uint8 * 16),
        ("reserved", ctypes.c_uint8 * 944),
    ]


SNAP_DESTROY = _ioc(1, 15, ctypes.sizeof(VolArgs))
INO_LOOKUP = _ioc(3, 18, ctypes.sizeof(InoLookupArgs))
SUBVOL_CREATE_V2 = _ioc(1, 24, ctypes.sizeof(VolArgsV2))
FS_INFO = _ioc(2, 31, ctypes.sizeof(FsInfoArgs))
QUOTA_CTL = _ioc(3, 40, ctypes.sizeof(QuotaCtlArgs))
QGROUP_ASSIGN = _ioc(1, 41, ctypes.sizeof(QgroupAssignArgs))
QGROUP_CREATE = _ioc(1, 42, ctypes.sizeof(QgroupCreateArgs))
QGROUP_LIMIT = _ioc(2, 43, ctypes.sizeof(QgroupLimitArgs))
SNAP_DESTROY_V2 = _ioc(1, 63, ctypes.sizeof(VolArgsV2))


def qgroup_id(level: int, subvolume: int) -> int:
    """The qgroup id ``level/subvolume`` as the kernel packs it."""
    return (level << 48) | subvolume


def _call(fd: int, request: int, args: ctypes.Structure) -> None:
    fcntl.ioctl(fd, request, args)


def create_subvolume(dir_fd: int, name: str) -> None:
    """Make subvolume ``name`` in ``dir_fd`` (its qgroup ``0/<id>`` comes with it)."""
    args = VolArgsV2()
    args.tail.name = os.fsencode(name)
    _call(dir_fd, SUBVOL_CREATE_V2, args)


def destroy_subvolume(dir_fd: int, name: str) -> None:
    """Delete the (childless) subvolume ``name`` of ``dir_fd``, whatever files it holds."""
    args = VolArgs()
    args.name = os.fsencode(name)
    _call(dir_fd, SNAP_DESTROY, args)


def subvolume_id(fd: int) -> int:
    """The id of the subvolume holding the open file ``fd``."""
    args = InoLookupArgs(treeid=0, objectid=FIRST_FREE_OBJECTID)
    _call(fd, INO_LOOKUP, args)
    return int(args.treeid)


def filesystem_uuid(fd: int) -> str:
    """The filesystem's UUID as ``/sys/fs/btrfs`` names it."""
    args = FsInfoArgs()
    _call(fd, FS_INFO, args)
    raw = bytes(args.fsid).hex()
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


def quota_ctl(fd: int, command: int) -> None:
    """``BTRFS_IOC_QUOTA_CTL``: enable qgroups (``QUOTA_ENABLE``, ``QUOTA_ENABLE_SIMPLE``)."""
    _call(fd, QUOTA_CTL, QuotaCtlArgs(cmd=command))


def create_qgroup(fd: int, qgroupid: int) -> None:
    _call(fd, QGROUP_CREATE, QgroupCreateArgs(create=1, qgroupid=qgroupid))


def remove_qgroup(fd: int, qgroupid: int) -> None:
    _call(fd, QGROUP_CREATE, QgroupCreateArgs(create=0, qgroupid=qgroupid))


def assign_qgroup(fd: int, child: int, parent: int, assign: bool = True) -> None:
    _call(fd, QGROUP_ASSIGN, QgroupAssignArgs(assign=int(assign), src=child, dst=parent))


def limit_qgroup(fd: int, qgroupid: int, max_referenced: int) -> None:
    lim = QgroupLimit(flags=LIMIT_MAX_RFER, max_rfer=max_referenced)
    _call(fd, QGROUP_LIMIT, QgroupLimitArgs(qgroupid=qgroupid, lim=lim))
