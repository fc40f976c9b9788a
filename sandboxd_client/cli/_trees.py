"""``sandboxctl put``/``get`` of whole directories from a daemon without tar streams
(``files.tree``): every file of the tree, several at once, in this one process (one connection
pool), with one progress line for the whole tree. A daemon with them gets one tar stream
(``HttpSandbox.upload_tree``/``download_tree``), which also keeps modes and symlinks."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.python.failure import Failure

from .._types import SandboxHandle

if TYPE_CHECKING:
    from .. import HttpSandbox

TREE_CAPABILITY = "files.tree"
"""The capability of a daemon that takes and gives trees as tar streams."""

CONCURRENT = 8
"""Files in flight at once."""

Progress = Callable[[int, int | None], None]


def local_files(root: str) -> list[tuple[str, str]]:
    """``(local path, path relative to root with /)`` of every regular file under ``root``;
    symbolic links are not followed."""
    found: list[tuple[str, str]] = []
    for top, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                found.append((path, relative))
    return found


def local_dirs(root: str) -> list[str]:
    """Every directory under ``root`` (relative, with /) that holds no file of its own tree:
    an upload of its files would not make it."""
    empty: list[str] = []
    for top, dirs, files in os.walk(root):
        if not dirs and not files and top != root:
            empty.append(os.path.relpath(top, root).replace(os.sep, "/"))
    return empty


class TreeProgress:
    """Sums the bytes of several transfers into one ``on_progress(done, total)``."""

    def __init__(self, total: int, on_progress: Progress) -> None:
        self.total = total
        self._done: dict[str, int] = {}
        self._on_progress = on_progress

    def of(self, name: str) -> Progress:
        def progress(done: int, total: int | None) -> None:
            self._done[name] = done  # a retry restarts from 0: counted once
            self._on_progress(sum(self._done.values()), self.total)

        return progress


async def _all(works: list[Callable[[], Awaitable[Any]]]) -> None:
    """Run ``works``, :data:`CONCURRENT` at a time; the first failure is raised (a worker
    stops at its failure, the others finish theirs)."""
    pending = iter(works)

    async def worker() -> None:
        for work in pending:
            await work()

    workers = [Deferred.fromCoroutine(worker()) for _ in range(CONCURRENT)]
    results = await DeferredList(workers, consumeErrors=True)
    for ok, failure in results:
        if not ok:
            assert isinstance(failure, Failure)
            failure.raiseException()


async def put_tree(
    client: HttpSandbox, handle: SandboxHandle, local: str, remote: str, on_progress: Progress
) -> int:
    """Upload the directory ``local`` so that ``remote`` holds its tree; the files sent."""
    files = local_files(local)
    sizes = {rel: os.path.getsize(path) for path, rel in files}
    progress = TreeProgress(sum(sizes.values()), on_progress)
    for empty in local_dirs(local):
        await client.mkdir(handle, posixpath.join(remote, empty))
    if not files:
        await client.mkdir(handle, remote)

    def one(path: str, rel: str) -> Callable[[], Awaitable[Any]]:
        target = posixpath.join(remote, rel)
        return lambda: client.upload_file(handle, target, path, on_progress=progress.of(rel))

    await _all([one(path, rel) for path, rel in files])
    return len(files)


def remote_relative(path: str, root: str) -> str:
    """``/a/b/c`` under the walked root ``a`` → ``b/c`` (walk paths may lack the first /)."""
    top = root.strip("/")
    path = path.strip("/")
    return path[len(top) :].lstrip("/") if top else path


async def get_tree(
    client: HttpSandbox,
    handle: SandboxHandle,
    remote: str,
    local: str,
    on_progress: Progress,
    download_file: Callable[[], Awaitable[Any]],
) -> int:
    """Download ``remote`` to ``local``: a directory's tree, or (``download_file``) the one
    file it names; the files received."""
    entries = await client.walk(handle, remote)
    if not entries or (len(entries) == 1 and remote_relative(entries[0].path, remote) == ""):
        await download_file()
        return 1
    progress = TreeProgress(sum(e.size for e in entries), on_progress)
    os.makedirs(local, exist_ok=True)

    def one(path: str) -> Callable[[], Awaitable[Any]]:
        rel = remote_relative(path, remote)
        parts = rel.split("/")
        if any(part in ("", ".", "..") for part in parts):  # never outside LOCAL
            raise ValueError(f"the service listed a path that is not below {remote!r}: {path!r}")
        target = os.path.join(local, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        return lambda: client.download_to_file(handle, path, target, on_progress=progress.of(rel))

    await _all([one(e.path) for e in entries])
    return len(entries)
