"""A fork's files: a copy of another sandbox's, made before its namespaces are (docs/extensions.rst,
"Fork").

The new sandbox's directories are made as any sandbox's (its disk limit comes with them), then
the source's workspace, home, tmp and, for a sandbox of a template, the upper directory of its
root (its changes to the template's files) are copied in with ``cp -a --reflink=auto``: a
copy-on-write clone where the state root's filesystem can make one (btrfs, XFS), a plain copy
elsewhere, symbolic links copied as links and never followed. Whatever the source's uid and gid
owned is then handed to the fork's own (root's files stay root's). The copy is held to the
fork's disk limit: a source larger than it gives a clear error, and nothing of the fork is left.
Run in a worker thread (a workspace can be large).
"""

import os
import secrets
import stat
import subprocess
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from attrs import frozen
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorProcess
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from sandboxd.core.layout import PLAIN_DIRECTORIES, Layout
from sandboxd.core.sandbox import PLAIN, CreateRequest, Sandbox
from sandboxd.errors import NoCapacity
from sandboxd.isolation.base import PLAIN_ENV, Identity, Isolation
from sandboxd.isolation.disk.base import DiskDriver
from sandboxd.isolation.namespaces.root_view import ROOT_DIR, RootView

T = TypeVar("T")

PARTS = ("workspace", "home", "tmp")
"""A sandbox's own directories, copied into its fork."""
UPPER = os.path.join(ROOT_DIR, "upper")


@frozen
class Prefilled:
    """A fork's directories for :meth:`~sandboxd.isolation.base.Isolation.create`: made and
    filled already (:func:`copy_sandbox`), so its ``create`` does nothing; the rest is the
    layout's."""

    layout: Layout

    def create(self, rid: str, identity: Identity, disk: DiskDriver = PLAIN_DIRECTORIES) -> None:
        """Nothing: :func:`copy_sandbox` made them."""

    def destroy(self, rid: str, disk: DiskDriver = PLAIN_DIRECTORIES) -> None:
        self.layout.destroy(rid, disk)

    def directory(self, rid: str) -> str:
        return self.layout.directory(rid)

    def workspace(self, rid: str) -> str:
        return self.layout.workspace(rid)

    def home(self, rid: str) -> str:
        return self.layout.home(rid)

    def tmp(self, rid: str) -> str:
        return self.layout.tmp(rid)


class ForkFailed(OSError):
    """The source's files could not be copied (the message says why: often the fork's disk
    limit)."""


def copy_tree(source: str, target: str) -> None:
    """Copy what is in directory ``source`` into the existing directory ``target``."""
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", os.path.join(source, "."), target],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=PLAIN_ENV,
        check=False,
    )
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ForkFailed(f"fork: cannot copy the source's files: {why[-1] if why else 'cp failed'}")


def reown(top: str, source: Identity, identity: Identity) -> None:
    """Give every entry under ``top`` (itself included) owned by ``source``'s uid or gid to
    ``identity``'s; links are changed, never followed. Iterative: a tree can be deep."""
    pending = [top]
    while pending:
        path = pending.pop()
        st = os.lstat(path)
        uid = identity.uid if st.st_uid == source.uid else -1
        gid = identity.gid if st.st_gid == source.gid else -1
        if uid != -1 or gid != -1:
            os.lchown(path, uid, gid)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode))  # chown cleared them: as they were
        if stat.S_ISDIR(st.st_mode):
            with os.scandir(path) as entries:
                pending.extend(entry.path for entry in entries)


def copy_sandbox(
    layout: Layout,
    disk: DiskDriver,
    source_rid: str,
    rid: str,
    source: Identity,
    identity: Identity,
    rootfs: str | None,
) -> None:
    """Make sandbox ``rid``'s directories (as ``identity``'s, their top by ``disk``, with its
    root's where it runs in the template ``rootfs``), and copy ``source_rid``'s files into them,
    held to ``disk``'s limits. ``ForkFailed`` when the copy fails; the caller removes what was
    made."""
    layout.create(rid, identity, disk)
    parts = list(PARTS)
    if rootfs is not None:
        RootView(rootfs, layout.directory(rid)).prepare()
        parts.append(UPPER)

    def copy() -> None:
        for part in parts:
            target = os.path.join(layout.directory(rid), part)
            copy_tree(os.path.join(layout.directory(source_rid), part), target)
            reown(target, source, identity)

    disk.charged(copy)()


class Forks:
    """The manager's forks (a mixin: the manager provides these attributes)."""

    reactor: IReactorProcess
    isolation: Isolation
    admin_pool: ThreadPool
    layout: Layout

    def _admit(self) -> None:
        raise NotImplementedError  # pragma: no cover - the manager's

    def _identity(self) -> Identity:
        raise NotImplementedError  # pragma: no cover - the manager's

    def create(
        self, request: CreateRequest = PLAIN, made: tuple[str, Identity] | None = None
    ) -> Sandbox:
        raise NotImplementedError  # pragma: no cover - the manager's

    async def fork(self, source: Sandbox) -> Sandbox:
        """A new sandbox whose files are a copy of ``source``'s (its workspace, home, tmp, and
        its changes to its template's root; :mod:`sandboxd.core.fork`), with its own identity
        owning them, the same template, env and network mode, and no process; not restored,
        not persisted (no ``item_id``). The source's file calls in flight end first and its
        processes are frozen while it is copied (where the cgroup driver can freeze): the copy
        is of one moment. ``NoCapacity`` when the copy fails (the fork's disk limit): nothing
        of the fork is left."""
        self._admit()
        identity = self._identity()
        rid = secrets.token_hex(8)
        rootfs = None if source.template is None else source.template.rootfs
        disk = self.isolation.disk
        try:
            await DeferredList(list(source.file_calls))
            await source.isolation.freeze(True)
            try:
                await self._in_admin_pool(
                    copy_sandbox,
                    self.layout,
                    disk,
                    source.rid,
                    rid,
                    source.identity,
                    identity,
                    rootfs,
                )
            finally:
                with suppress(OSError):  # the source was killed meanwhile: nothing to thaw
                    await source.isolation.freeze(False)
        except BaseException as e:
            self.isolation.uids.release(identity)
            await self._in_admin_pool(self.layout.destroy, rid, disk)
            if isinstance(e, ForkFailed):
                raise NoCapacity(str(e)) from None
            raise  # pragma: no cover - an unexpected failure of the copy, re-raised as it is
        wanted = CreateRequest(env=source.env, network=source.network, template=source.template)
        return self.create(wanted, made=(rid, identity))

    def _in_admin_pool(self, work: Callable[..., T], *args: Any) -> Deferred[T]:
        return deferToThreadPool(
            self.reactor,  # type: ignore[arg-type]
            self.admin_pool,
            work,
            *args,
        )
