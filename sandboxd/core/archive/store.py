"""The archive: restore ``{archive}/{item_id}`` into a new workspace, persist it back.

**Who touches what.** Every copy is one rsync (:mod:`sandboxd.core.archive.rsync`) whose workspace
end runs as the sandbox (its uid/gid, inside its cgroup) and whose archive end runs as the
daemon. Restore therefore creates every file as the sandbox's uid, and can write nothing the
sandbox could not write itself, whatever links the archive holds; persist reads the workspace
with the sandbox's own rights, so a symlink to ``/etc/shadow`` or a directory swapped for a
link to a host directory mid-copy yields only what the sandbox could read anyway. Symlinks are
kept as symlinks (``-l``, never followed) and stored **munged** (``--munge-links``: the archive
end prefixes ``/rsyncd-munged/``), so the archive never holds a link root could follow; restore
un-munges them on the way out. No ``-p``, ``-o``, ``-g``, ``-H``, ``-D``: no device, no
hardlink, no owner is ever created from what a sandbox sent, and new archive files get the
workspace file's mode without its set-id bits.

**Atomicity.** A persist never writes into ``{archive}/{item_id}``: it builds the new version
in ``{archive}/.sandboxd-staging/`` (same filesystem) and swaps it in with one
``renameat2(RENAME_EXCHANGE)`` (two renames where the filesystem lacks it; a crash between them
is repaired by the next persist or restore of the item). An append-only checkpoint
(``delete: false``) first hard-links the current version into the staging tree (rsync writes a
changed file to a new inode, so the live version is never modified), then copies the workspace
over it without ``--delete``; a reconcile (``delete: true``) copies the workspace alone into an
empty staging tree, hard-linking unchanged files from the current version (``--link-dest``), so
the result is exactly the workspace, as ``--delete`` would make it. A failed rsync removes the
staging tree and raises :class:`ArchiveFailed` (``500``): the archive stays as it was.

**Ordering.** One :class:`~twisted.internet.defer.DeferredLock` per item: two persists, or a
persist and a restore, of one item never interleave within this daemon. One item is written by
one replica at a time (the application holds one sandbox per item).
"""

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from attrs import define, field
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from sandboxd.core.archive.rsync import REMOTE, Rsync, RsyncFailed, WorkspaceEnd
from sandboxd.errors import ArchiveFailed

P = ParamSpec("P")
T = TypeVar("T")

STAGING = ".sandboxd-staging"
"""Directory under the archive root for versions being built; ``item_id`` may not start so."""

RESERVED_PREFIX = ".sandboxd-"

MUNGE_PREFIX_DIR = "/rsyncd-munged"
"""Munged links point under here; it must not exist, or munged links would resolve."""

COPY = ("-rlt", "--modify-window=-1")
"""Recursive, symlinks as symlinks, modification times; files count as unchanged (not copied,
or hard-linked by ``--link-dest``) only when size and mtime agree to the nanosecond."""

RENAME_EXCHANGE = 2

log = Logger()


class ArchiveUnavailable(Exception):
    """The archive cannot be used on this host (start-up refuses, naming the cause)."""


def _renameat2(libc: Any) -> Callable[[str, str], None] | None:
    """``renameat2(RENAME_EXCHANGE)`` of ``libc`` (a ``ctypes.CDLL``), or ``None`` when it has
    no such function (a C library older than glibc 2.28)."""
    call = getattr(libc, "renameat2", None)
    if call is None:
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    at_fdcwd = -100

    def exchange(a: str, b: str) -> None:
        if call(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), a)

    return exchange


_EXCHANGE = _renameat2(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True))


def exchange(new: str, current: str, old: str) -> None:
    """Put ``new`` in place of ``current``; the previous version ends at ``old`` (removable).

    One atomic exchange where the filesystem has it, else ``current → old, new → current``.
    """
    if _EXCHANGE is not None:
        try:
            _EXCHANGE(new, current)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
        else:
            os.rename(new, old)
            return
    os.rename(current, old)
    os.rename(new, current)


def check_host(archive_root: str) -> None:
    """Refuse an archive that cannot be kept safe here (:class:`ArchiveUnavailable`)."""
    if os.path.lexists(MUNGE_PREFIX_DIR):
        raise ArchiveUnavailable(
            f"{MUNGE_PREFIX_DIR} exists: archived symlinks (munged under it) could resolve"
        )
    if not os.path.isabs(archive_root):
        raise ArchiveUnavailable(f"SANDBOXD_ARCHIVE_ROOT: {archive_root} is not absolute")


def detached(work: Deferred[T]) -> Deferred[T]:
    """A Deferred with ``work``'s result whose cancellation leaves ``work`` running.

    A failure of ``work`` nobody waits for any more is logged, not left unhandled.
    """
    outer: Deferred[T] = Deferred(lambda _: None)

    def forward(result: T | Failure) -> None:
        if outer.called:
            if isinstance(result, Failure):
                log.failure("archive work finished after its caller left", result)
            return
        if isinstance(result, Failure):
            outer.errback(result)
        else:
            outer.callback(result)

    work.addBoth(forward)
    return outer


@define
class Archive:
    """Restores and persists workspaces under ``root`` (``{root}/{item_id}``).

    Blocking filesystem work (renames, removing a tree) runs in ``pool``; rsync runs as a child
    process of ``rsync``'s reactor.
    """

    root: str
    rsync: Rsync
    pool: ThreadPool
    _locks: dict[str, DeferredLock] = field(factory=dict, init=False)

    @property
    def staging(self) -> str:
        return os.path.join(self.root, STAGING)

    def prepare(self) -> None:
        """Create the root and the staging directory, both 0700 (no sandbox may list or reach
        the archive: an existing root is made 0700 too)."""
        check_host(self.root)
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.makedirs(self.staging, mode=0o700, exist_ok=True)
        os.chmod(self.staging, 0o700)

    def item(self, item_id: str) -> str:
        """``{root}/{item_id}``; an item_id that is not one plain component is refused (the API
        validates first: this is the last line)."""
        if (
            not item_id
            or "/" in item_id
            or "\0" in item_id
            or item_id in (".", "..")
            or item_id.startswith(RESERVED_PREFIX)
        ):
            raise ArchiveFailed(f"item_id {item_id!r} cannot name an archive entry")
        return os.path.join(self.root, item_id)

    def _names(self, item_id: str) -> tuple[str, str]:
        """``(staging prefix, old path)`` of an item (hashed: an item_id may be 255 bytes)."""
        digest = hashlib.sha256(item_id.encode("utf-8", "surrogateescape")).hexdigest()[:40]
        return os.path.join(self.staging, digest + ".tmp-"), os.path.join(self.staging, digest)

    def restore(self, item_id: str, end: WorkspaceEnd) -> Deferred[bool]:
        """Copy ``{root}/{item_id}`` into ``end``'s (empty) workspace, as the sandbox.

        Fires ``False`` when the item has no archive entry (nothing copied). Cancelling the
        result (a client that went away) does not stop the copy: it completes in the background.
        """
        return detached(Deferred.fromCoroutine(self._restore(item_id, end)))

    def persist(self, item_id: str, end: WorkspaceEnd, delete: bool) -> Deferred[None]:
        """Copy ``end``'s workspace to ``{root}/{item_id}``: a reconcile with ``delete``, else
        an append-only checkpoint. On failure the archive is unchanged (:class:`ArchiveFailed`).
        Cancelling the result does not stop the copy (nor undo it).
        """
        return detached(Deferred.fromCoroutine(self._persist(item_id, end, delete)))

    async def _restore(self, item_id: str, end: WorkspaceEnd) -> bool:
        async with self._lock(item_id):
            present = await self._blocking(self._repair, item_id)
            if not present:
                return False
            args = [*COPY, "--munge-links", "--", self.item(item_id) + "/", REMOTE]
            await self._rsync(lambda: self.rsync.with_workspace(end, args), "restore", item_id)
            return True

    async def _persist(self, item_id: str, end: WorkspaceEnd, delete: bool) -> None:
        async with self._lock(item_id):
            current = self.item(item_id)
            present = await self._blocking(self._repair, item_id)
            prefix, old = self._names(item_id)
            new = prefix + secrets.token_hex(8)
            await self._blocking(os.mkdir, new, 0o700)
            try:
                link = [f"--link-dest={current}"] if present else []
                if present and not delete:
                    keep = [*COPY, *link, "--", current + "/", new + "/"]
                    await self._rsync(
                        lambda: self.rsync.local(keep),
                        "persist (keeping the current version)",
                        item_id,
                    )
                    link = []
                args = [*COPY, "--munge-links", *link, "--", REMOTE, new + "/"]
                if delete:
                    args.insert(1, "--delete")
                await self._rsync(lambda: self.rsync.with_workspace(end, args), "persist", item_id)
                await self._blocking(self._install, new, current, old, present)
            except BaseException:
                await self._blocking(shutil.rmtree, new, True)
                raise
        log.info(
            "persisted item {item_id} ({mode})",
            item_id=item_id,
            mode="reconcile" if delete else "checkpoint",
        )

    @contextlib.asynccontextmanager
    async def _lock(self, item_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(item_id, DeferredLock())
        await lock.acquire()
        try:
            yield
        finally:
            lock.release()
            if not lock.locked and not lock.waiting:
                self._locks.pop(item_id, None)

    async def _rsync(self, run: Callable[[], Deferred[None]], what: str, item_id: str) -> None:
        try:
            await run()
        except RsyncFailed as e:
            log.error("{what} of item {item_id} failed: {e}", what=what, item_id=item_id, e=e)
            raise ArchiveFailed(f"{what} of item {item_id!r} failed: {e}") from None

    def _blocking(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        reactor: Any = self.rsync.reactor
        return deferToThreadPool(reactor, self.pool, work, *args, **kwargs)

    def _repair(self, item_id: str) -> bool:
        """Undo a swap a crash interrupted, drop stale staging trees; is the item present?"""
        prefix, old = self._names(item_id)
        current = self.item(item_id)
        if not os.path.lexists(current) and os.path.isdir(old):
            log.warn("item {item_id}: restoring the version a crash left aside", item_id=item_id)
            os.rename(old, current)
        stale = [os.path.join(self.staging, n) for n in os.listdir(self.staging)]
        for path in stale:
            if path.startswith(prefix) or path == old:
                shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(current):
            return False
        if os.path.islink(current) or not os.path.isdir(current):
            raise ArchiveFailed(f"archive entry of item {item_id!r} is not a directory")
        return True

    @staticmethod
    def _install(new: str, current: str, old: str, present: bool) -> None:
        os.chmod(new, 0o700)
        if present:
            exchange(new, current, old)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(new, current)


SEARCH_PATH = os.defpath + ":/usr/sbin:/sbin"
MIN_RSYNC = (3, 1, 3)
SAFE_RSYNC = (3, 4, 0)


def rsync_version(rsync: str) -> tuple[int, ...]:
    """The version of the ``rsync`` program (start-up only: runs it and waits)."""
    try:
        shown = subprocess.run(
            [rsync, "--version"], capture_output=True, timeout=30, check=False
        ).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError) as e:
        raise ArchiveUnavailable(f"{rsync} does not run: {e}") from None
    found = re.search(r"version\s+v?(\d+)\.(\d+)\.(\d+)", shown)
    if found is None:
        raise ArchiveUnavailable(f"{rsync} --version shows no version")
    return tuple(int(part) for part in found.groups())


def build_archive(
    root: str, reactor: Any, pool: ThreadPool, search_path: str = SEARCH_PATH
) -> Archive:
    """The archive under ``root``, its directories made; :class:`ArchiveUnavailable` names
    what is missing (rsync above all: start-up fails loudly without it)."""
    rsync = shutil.which("rsync", path=search_path)
    if rsync is None:
        raise ArchiveUnavailable(
            f"rsync not found in {search_path}: install it, or unset SANDBOXD_ARCHIVE_ROOT"
        )
    version = rsync_version(rsync)
    if version < MIN_RSYNC:
        raise ArchiveUnavailable(
            f"{rsync} is version {'.'.join(map(str, version))}; the archive needs"
            f" {'.'.join(map(str, MIN_RSYNC))} or later (--munge-links, nanosecond times)"
        )
    if version < SAFE_RSYNC:
        log.warn(
            "archive: rsync {version} predates the 3.4.0 fixes of CVE-2024-12084..12088;"
            " upgrade it",
            version=".".join(map(str, version)),
        )
    archive = Archive(root, Rsync(reactor, rsync), pool)
    try:
        archive.prepare()
    except OSError as e:
        raise ArchiveUnavailable(f"SANDBOXD_ARCHIVE_ROOT: {root}: {e.strerror}") from None
    return archive
