"""The on-disk layout of one sandbox (docs/isolation.rst, "Layout").

``{root}/{rid}/`` is owned root:{gid} mode 0710, so the sandbox can enter it but not change it;
inside it ``workspace/``, ``home/`` and ``tmp/`` belong to the sandbox's uid (0700), and the
ready marker ``.ready`` is a root-owned sibling of the workspace that the sandbox cannot forge.
"""

import contextlib
import fcntl
import os
import stat
from collections.abc import Callable

from attrs import frozen

from sandboxd.core.files import tree
from sandboxd.isolation.base import Identity
from sandboxd.isolation.disk.base import DiskDriver
from sandboxd.isolation.disk.plain import NoDiskLimits
from sandboxd.isolation.naming import RID

RID_PATTERN = RID
"""A sandbox id (:data:`sandboxd.isolation.naming.RID`)."""
SUBDIRS = ("workspace", "home", "tmp")
PLAIN_DIRECTORIES = NoDiskLimits()
"""A top directory under no disk limit (a plain ``mkdir``)."""


class RootInUse(Exception):
    """Another daemon holds the lock of this state root."""


@frozen
class Layout:
    """Where a sandbox's directories live; ``chown`` is injectable for tests without root.

    The disk limits are the isolation's (``Isolation.disk``): it makes and removes each
    sandbox's tree through :meth:`create` and :meth:`destroy`, handing them its disk driver."""

    root: str
    owns_files: bool
    chown: Callable[[str, int, int], None] = os.chown

    def directory(self, rid: str) -> str:
        return os.path.join(self.root, rid)

    def workspace(self, rid: str) -> str:
        return os.path.join(self.root, rid, "workspace")

    def home(self, rid: str) -> str:
        return os.path.join(self.root, rid, "home")

    def tmp(self, rid: str) -> str:
        return os.path.join(self.root, rid, "tmp")

    def ready_marker(self, rid: str) -> str:
        return os.path.join(self.root, rid, ".ready")

    def prepare_root(self) -> None:
        """Create the root (0711: sandboxes may pass through it, never list it).

        When sandboxes run as uids of their own, every directory above the root must let them
        through (search permission for others), or no command could enter its workspace:
        that is refused here with the directory named.
        """
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        if not self.owns_files:
            return
        os.chmod(self.root, 0o711)
        path = os.path.abspath(self.root)
        while True:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                raise PermissionError(
                    f"{path} is not searchable by sandbox uids (chmod o+x, or choose another"
                    " SANDBOXD_ROOT)"
                )
            parent = os.path.dirname(path)
            if parent == path:
                return
            path = parent

    def lock(self) -> int:
        """Hold ``{root}/.lock`` for the life of the process, so that no two daemons share a root
        (each would take the other's sandboxes for a crashed predecessor's leftovers).

        Returns the descriptor that holds the lock (kept open on purpose).
        """
        path = os.path.join(self.root, ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RootInUse(f"another sandboxd is using {self.root}") from None
        return fd

    def create(self, rid: str, identity: Identity, disk: DiskDriver = PLAIN_DIRECTORIES) -> None:
        """Make the sandbox's directory tree with its ownership (docs/isolation.rst, "Layout"),
        its top directory by ``disk`` (a subvolume or a quota project under a disk limit)."""
        top = self.directory(rid)
        disk.make_directory(top, identity)
        os.chmod(top, 0o710)
        if self.owns_files:
            self.chown(top, 0, identity.gid)
        for name in SUBDIRS:
            path = os.path.join(top, name)
            os.mkdir(path, 0o700)
            if self.owns_files:
                self.chown(path, identity.uid, identity.gid)

    def mark_ready(self, rid: str) -> None:
        fd = os.open(self.ready_marker(rid), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        os.close(fd)

    def is_ready(self, rid: str) -> bool:
        return os.path.isfile(self.ready_marker(rid)) and not os.path.islink(self.ready_marker(rid))

    def destroy(self, rid: str, disk: DiskDriver = PLAIN_DIRECTORIES) -> None:
        """Remove the ready marker first, then every file of the sandbox, its top directory
        (and its quota) by ``disk``."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ready_marker(rid))
        # Not shutil.rmtree: it recurses, and a sandbox can nest directories deeper than
        # Python's recursion limit (a RecursionError here would leak the uid and the files).
        disk.destroy(self.directory(rid), tree.remove_tree)

    def leftovers(self) -> list[str]:
        """Sandbox directories present under the root (a predecessor's, at start-up)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(name for name in names if RID_PATTERN.match(name))
