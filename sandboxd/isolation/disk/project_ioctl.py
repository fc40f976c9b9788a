"""Project quotas of ext4 and XFS through ctypes: the directory's project id and inherit flag
(``FS_IOC_FSGETXATTR``/``FS_IOC_FSSETXATTR``), limits and usage (``quotactl_fd``), and dropping
``CAP_SYS_RESOURCE`` from one thread (``capget``/``capset``)."""

import ctypes
import ctypes.util
import fcntl
import os
from typing import Any

PRJQUOTA = 2
Q_GETINFO = 0x800005
Q_GETQUOTA = 0x800007
Q_SETQUOTA = 0x800008
QIF_BLIMITS = 1
QIF_ILIMITS = 4
QUOTA_BLOCK = 1024
"""The unit of ``dqb_bhardlimit`` (``QIF_DQBLKSIZE``)."""
FS_XFLAG_PROJINHERIT = 0x200
EXT4_SUPER_MAGIC = 0xEF53
XFS_SUPER_MAGIC = 0x58465342
CAP_SYS_RESOURCE = 24
_CAPABILITY_VERSION_3 = 0x20080522
_SYS_QUOTACTL_FD = 443
_SYS_CAPGET = 125
_SYS_CAPSET = 126


class FsXattr(ctypes.Structure):
    _fields_ = [
        ("xflags", ctypes.c_uint32),
        ("extsize", ctypes.c_uint32),
        ("nextents", ctypes.c_uint32),
        ("projid", ctypes.c_uint32),
        ("cowextsize", ctypes.c_uint32),
        ("pad", ctypes.c_uint8 * 8),
    ]


class DqBlk(ctypes.Structure):
    """``struct if_dqblk``."""

    _fields_ = [
        ("bhardlimit", ctypes.c_uint64),
        ("bsoftlimit", ctypes.c_uint64),
        ("curspace", ctypes.c_uint64),
        ("ihardlimit", ctypes.c_uint64),
        ("isoftlimit", ctypes.c_uint64),
        ("curinodes", ctypes.c_uint64),
        ("btime", ctypes.c_uint64),
        ("itime", ctypes.c_uint64),
        ("valid", ctypes.c_uint32),
    ]


class DqInfo(ctypes.Structure):
    _fields_ = [
        ("bgrace", ctypes.c_uint64),
        ("igrace", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("valid", ctypes.c_uint32),
    ]


class StatFs(ctypes.Structure):
    _fields_ = [("type", ctypes.c_long), ("rest", ctypes.c_uint8 * 112)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


FSGETXATTR = (2 << 30) | (ctypes.sizeof(FsXattr) << 16) | (ord("X") << 8) | 31
FSSETXATTR = (1 << 30) | (ctypes.sizeof(FsXattr) << 16) | (ord("X") << 8) | 32

_libc: Any = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]


def _check(result: int) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def filesystem_type(path: str) -> int:
    """``statfs(path).f_type``: the filesystem's magic number."""
    buf = StatFs()
    _check(_libc.statfs(os.fsencode(path), ctypes.byref(buf)))
    return int(buf.type) & 0xFFFFFFFF


def get_project(fd: int) -> int:
    """The project id of the open file ``fd``."""
    attrs = FsXattr()
    fcntl.ioctl(fd, FSGETXATTR, attrs)
    return int(attrs.projid)


def set_project(fd: int, project: int) -> None:
    """Give the directory ``fd`` the project id ``project`` and the inherit flag: everything
    made in it from now on belongs to that project."""
    attrs = FsXattr()
    fcntl.ioctl(fd, FSGETXATTR, attrs)
    attrs.projid = project
    attrs.xflags |= FS_XFLAG_PROJINHERIT
    fcntl.ioctl(fd, FSSETXATTR, attrs)


def _quotactl(fd: int, command: int, project: int, data: ctypes.Structure) -> None:
    cmd = ctypes.c_uint((command << 8) | PRJQUOTA)
    args = (ctypes.c_long(_SYS_QUOTACTL_FD), ctypes.c_uint(fd), cmd, ctypes.c_uint(project))
    _check(_libc.syscall(*args, ctypes.byref(data)))


def quota_info(fd: int) -> DqInfo:
    """``Q_GETINFO`` for project quotas: ``ESRCH`` when they are not on."""
    info = DqInfo()
    _quotactl(fd, Q_GETINFO, 0, info)
    return info


def get_quota(fd: int, project: int) -> DqBlk:
    block = DqBlk()
    _quotactl(fd, Q_GETQUOTA, project, block)
    return block


def set_limits(fd: int, project: int, bytes_limit: int | None, files_limit: int | None) -> None:
    """Hard limits of ``project`` (``None``: none), in one ``Q_SETQUOTA``."""
    block = DqBlk(valid=QIF_BLIMITS | QIF_ILIMITS)
    if bytes_limit is not None:
        block.bhardlimit = block.bsoftlimit = -(-bytes_limit // QUOTA_BLOCK)
    if files_limit is not None:
        block.ihardlimit = block.isoftlimit = files_limit
    _quotactl(fd, Q_SETQUOTA, project, block)


def _capabilities() -> tuple[_CapHeader, "ctypes.Array[_CapData]"]:
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.syscall(ctypes.c_long(_SYS_CAPGET), ctypes.byref(header), data))
    return header, data


def set_sys_resource(effective: bool) -> bool:
    """Raise or lower ``CAP_SYS_RESOURCE`` in the calling thread's effective set (it stays
    permitted); returns whether it was effective before."""
    header, data = _capabilities()
    bit = 1 << CAP_SYS_RESOURCE
    before = bool(data[0].effective & bit)
    if effective:
        data[0].effective |= bit
    else:
        data[0].effective &= ~bit
    _check(_libc.syscall(ctypes.c_long(_SYS_CAPSET), ctypes.byref(header), data))
    return before
