"""
Whole directory trees to and from a sandbox as tar streams, in one request each (the
``files.tree`` extension; ``capabilities(handle)`` says whether a replica has it).

Uploads stream: a local tree is packed a part at a time as the connection takes it, a tar
stream (stdin) is read a chunk at a time. A download streams to a file: a tar stream to any
binary file (stdout), a tree through an unnamed temporary file beside the destination, then
unpacked (see ``_tars.unpack``: nothing lands outside the destination). Memory stays bounded
whatever the tree's size.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO

from twisted.web.iweb import UNKNOWN_LENGTH

from . import _tars
from . import _wire as wire
from ._base import ClientBase, Handle
from ._deferreds import async_to_deferred
from ._handles import decode_handle
from ._retry import retrying

TAR = b"application/x-tar"
TREE_CAPABILITY = "files.tree"

Progress = Callable[[int, int | None], object]


class Trees(ClientBase):
    """Trees as tar streams, and the capabilities of the replica holding a sandbox."""

    @async_to_deferred
    async def capabilities(self, handle: Handle) -> frozenset[str]:
        """What the replica holding ``handle`` implements (its ``/healthz`` capabilities),
        asked once per replica and remembered."""
        base = decode_handle(handle).base
        key = str(base)
        cache = self._capabilities
        if key not in cache:
            reply = await self._idempotent("GET", base.child("healthz"))
            cache[key] = frozenset(wire.decode_health(reply).capabilities)
        return cache[key]

    async def _put_tar(
        self,
        handle: Handle,
        path: str,
        source: IO[bytes],
        on_progress: Progress | None,
        deadline: float,
    ) -> None:
        url = self._url(handle, "tree").set("path", path)
        await self._put_stream(url, source, TAR, None, on_progress, deadline)

    @async_to_deferred
    async def upload_tree(
        self, handle: Handle, path: str, local_dir: str, *, on_progress: Progress | None = None
    ) -> None:
        """Make ``path`` hold the tree of the local directory ``local_dir`` (modes, mtimes,
        symlinks as links, empty directories), packed as it is sent. Retried on
        ``SandboxBusy`` (from the start: a tree's upload replaces what it wrote)."""

        async def attempt(deadline: float) -> None:
            reader = _tars.PackReader(_tars.pack(local_dir))
            await self._put_tar(handle, path, reader, on_progress, deadline)  # type: ignore[arg-type]

        await retrying(self._clock, self._retry, attempt)

    @async_to_deferred
    async def upload_tar(
        self, handle: Handle, path: str, source: IO[bytes], *, on_progress: Progress | None = None
    ) -> None:
        """Unpack the tar stream read from ``source`` (stdin, say) below ``path``; sent once
        (a stream cannot be read again)."""
        reader = _tars.StreamReader(source)
        await self._put_tar(handle, path, reader, on_progress, self._retry.timeout)  # type: ignore[arg-type]

    async def _get_tar(
        self,
        handle: Handle,
        path: str,
        sink: IO[bytes],
        on_progress: Progress | None,
        deadline: float,
    ) -> None:
        url = self._url(handle, "tree").set("path", path)
        response = await self._http.send("GET", url, timeout=deadline, service=False)
        await self._http.check(response, timeout=deadline, service=False)
        total = None if response.length is UNKNOWN_LENGTH else int(response.length)
        received = [0]

        def write(data: bytes) -> None:
            sink.write(data)
            received[0] += len(data)
            if on_progress is not None:
                on_progress(received[0], total)

        await self._http.read(response, write, timeout=deadline, service=False)

    @async_to_deferred
    async def download_tar(
        self, handle: Handle, path: str, sink: IO[bytes], *, on_progress: Progress | None = None
    ) -> None:
        """Write the tree at ``path`` as a tar stream to ``sink`` (stdout, say) as it comes;
        read once (what was written cannot be taken back). A stream cut short raises, and
        ``sink`` then holds an unfinished archive."""
        await self._get_tar(handle, path, sink, on_progress, self._retry.timeout)

    @async_to_deferred
    async def download_tree(
        self, handle: Handle, path: str, local_dir: str, *, on_progress: Progress | None = None
    ) -> int:
        """Make the local directory ``local_dir`` hold the tree at ``path`` (modes, mtimes,
        symlinks as links, empty directories); the members written. The stream goes to an
        unnamed temporary file beside ``local_dir`` first (retried from the start on
        ``SandboxBusy``), and is unpacked only once it is whole."""
        parent = os.path.dirname(os.path.abspath(local_dir))

        async def attempt(deadline: float) -> int:
            with tempfile.TemporaryFile(dir=parent) as spool:
                await self._get_tar(handle, path, spool, on_progress, deadline)
                spool.seek(0)
                return _tars.unpack(spool, local_dir)

        return await retrying(self._clock, self._retry, attempt)
