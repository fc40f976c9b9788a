"""ext4 and XFS: a project quota per sandbox.

Each sandbox directory ``{root}/{rid}`` gets the sandbox's uid as project id, with the inherit
flag, so everything made below it belongs to that project; the project's hard limits are the
byte and file limits (the layout's own directories count as files: :data:`LAYOUT_FILES` are
added). The filesystem must be mounted with project quotas enforced (ext4 ``prjquota`` on a
filesystem made with ``-O quota,project``; XFS ``pquota``).

ext4 lets ``CAP_SYS_RESOURCE`` write past a hard limit: the daemon's file work for a sandbox
(uploads, mkdir...) therefore runs with that capability lowered in its thread
(:meth:`ProjectQuotas.charged`).
"""

import os
from collections.abc import Callable
from typing import TypeVar

from attrs import define

from sandboxd.isolation.base import Identity
from sandboxd.isolation.disk import project_ioctl as q
from sandboxd.isolation.disk.base import DiskLimits, DiskUnavailable, DiskUsage, RemoveTree

T = TypeVar("T")

LAYOUT_FILES = 5
"""Inodes of the layout itself: the top directory, workspace, home, tmp and ``.ready``."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@define
class ProjectQuotas:
    """The project-quota disk driver of one state root (its descriptor kept open)."""

    root: str
    limits: DiskLimits
    root_fd: int
    name: str

    @classmethod
    def open(cls, root: str, limits: DiskLimits, name: str) -> "ProjectQuotas":
        """The driver for ``root`` on ext4 or XFS (``name``); ``DiskUnavailable`` when project
        quotas are not on."""
        fd = os.open(root, _DIR)
        try:
            q.quota_info(fd)
        except OSError as e:
            os.close(fd)
            mount = (
                "prjquota (made with mkfs.ext4 -O quota,project)" if name == "ext4" else "pquota"
            )
            raise DiskUnavailable(
                f"disk: {name} project quotas are not on for {root} ({e.strerror}): mount it"
                f" with {mount}"
            ) from None
        return cls(root, limits, fd, name)

    @property
    def enforcing(self) -> bool:
        return True

    def make_directory(self, path: str, identity: Identity) -> None:
        os.mkdir(path, 0o700)
        fd = os.open(path, _DIR)
        try:
            q.set_project(fd, identity.uid)
        finally:
            os.close(fd)
        files = None if self.limits.files is None else self.limits.files + LAYOUT_FILES
        q.set_limits(self.root_fd, identity.uid, self.limits.bytes, files)

    def usage(self, path: str) -> DiskUsage:
        fd = os.open(path, _DIR)
        try:
            project = q.get_project(fd)
        finally:
            os.close(fd)
        block = q.get_quota(self.root_fd, project)
        return DiskUsage(
            bytes=block.curspace,
            bytes_limit=block.bhardlimit * q.QUOTA_BLOCK or None,
            files=block.curinodes,
            files_limit=block.ihardlimit or None,
        )

    def destroy(self, path: str, remove_tree: RemoveTree) -> None:
        remove_tree(path)

    def sweep(self, live: Callable[[str], bool]) -> int:
        """Nothing outlives a directory: a project's usage is its files."""
        return 0

    def charged(self, work: Callable[[], T]) -> Callable[[], T]:
        """``work`` run with ``CAP_SYS_RESOURCE`` lowered in its thread, so ext4 holds the
        sandbox's file work to its hard limits."""

        def run() -> T:
            before = q.set_sys_resource(False)
            try:
                return work()
            finally:
                if before:
                    q.set_sys_resource(True)

        return run
