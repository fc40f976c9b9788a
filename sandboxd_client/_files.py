"""
The file calls of ``HttpSandbox`` that carry no file body (uploads and downloads are in
``_transfers``): probes, walk, delete, mkdir, rmdir, rename.
"""

from __future__ import annotations

from . import _wire as wire
from ._base import ClientBase, Handle
from ._deferreds import async_to_deferred
from ._transport import collector_paused
from ._types import WalkEntry


class Files(ClientBase):
    """Probe, list and change a sandbox's files and directories."""

    @async_to_deferred
    async def exists(self, handle: Handle, path: str) -> bool:
        """Whether a file or directory exists at ``path``."""
        reply = await self._idempotent("GET", self._url(handle, "exists").set("path", path))
        return wire.decode_field(reply, "exists", bool, "exists")

    @async_to_deferred
    async def size(self, handle: Handle, path: str) -> int | None:
        """Size of the regular file at ``path``, or ``None`` if there is none."""
        reply = await self._idempotent("GET", self._url(handle, "size").set("path", path))
        return wire.decode_size(reply)

    @async_to_deferred
    async def disk_usage(self, handle: Handle) -> int:
        """Bytes used by the whole workspace."""
        reply = await self._idempotent("GET", self._url(handle, "disk-usage"))
        return wire.decode_field(reply, "bytes", int, "disk-usage")

    @async_to_deferred
    async def walk(self, handle: Handle, root: str = "/") -> list[WalkEntry]:
        """Every regular file under ``root``."""
        reply = await self._idempotent("GET", self._url(handle, "walk").set("root", root))
        with collector_paused():  # one entry per file: see ``collector_paused``
            return wire.decode_walk(reply)

    @async_to_deferred
    async def delete(self, handle: Handle, path: str) -> None:
        """Delete the file at ``path`` (``FileNotFoundError`` if missing)."""
        url = self._url(handle, "file").set("path", path)
        await self._idempotent("DELETE", url, gone_ok=FileNotFoundError)

    @async_to_deferred
    async def mkdir(self, handle: Handle, path: str) -> None:
        """Create ``path`` and its parents (``mkdir -p``)."""
        await self._idempotent("POST", self._url(handle, "mkdir"), {"path": path})

    @async_to_deferred
    async def rmdir(self, handle: Handle, path: str) -> None:
        """Remove the directory ``path`` and its contents (``FileNotFoundError`` if missing)."""
        url = self._url(handle, "dir").set("path", path)
        await self._idempotent("DELETE", url, gone_ok=FileNotFoundError)

    @async_to_deferred
    async def rename(self, handle: Handle, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (replacing it); never retried."""
        url = self._url(handle, "rename")
        payload = {"src": src, "dst": dst}
        await self._once("POST", url, payload, timeout=self._retry.timeout, service=False)
