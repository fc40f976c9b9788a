"""
Uploads and downloads of ``HttpSandbox`` (a base class of it): whole ``bytes``, or streamed
from and to local files without holding them in memory, each retried on ``SandboxBusy``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from twisted.web.iweb import UNKNOWN_LENGTH

from ._base import OCTETS, ClientBase, Handle
from ._deferreds import async_to_deferred
from ._retry import retrying

Progress = Callable[[int, int | None], object]


class Transfers(ClientBase):
    """File bodies to and from a sandbox."""

    @async_to_deferred
    async def upload(self, handle: Handle, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (creating parent directories, replacing the file)."""
        url = self._url(handle, "file").set("path", path)

        async def attempt(deadline: float) -> None:
            body = self._http.producer(bytes(data))
            response = await self._http.send(
                "PUT", url, timeout=deadline, service=False, body=body, content_type=OCTETS
            )
            await self._http.check(response, timeout=deadline, service=False)
            await self._http.read(response, lambda _: None, timeout=deadline, service=False)

        await retrying(self._clock, self._retry, attempt)

    @async_to_deferred
    async def upload_file(
        self, handle: Handle, path: str, local_path: str, *, on_progress: Progress | None = None
    ) -> None:
        """
        Stream the local file ``local_path`` to ``path`` without reading it into memory.

        ``on_progress(sent, total)`` follows the transfer (restarting from 0 on a retry).
        """
        url = self._url(handle, "file").set("path", path)

        async def attempt(deadline: float) -> None:
            with open(local_path, "rb") as f:
                total = os.fstat(f.fileno()).st_size
                await self._put_stream(url, f, OCTETS, total, on_progress, deadline)

        await retrying(self._clock, self._retry, attempt)

    @async_to_deferred
    async def download(self, handle: Handle, path: str) -> bytes:
        """Read the whole file at ``path`` into memory (see ``download_to_file`` for big ones)."""
        url = self._url(handle, "file").set("path", path)

        async def attempt(deadline: float) -> bytes:
            chunks: list[bytes] = []
            response = await self._http.send("GET", url, timeout=deadline, service=False)
            await self._http.check(response, timeout=deadline, service=False)
            await self._http.read(response, chunks.append, timeout=deadline, service=False)
            return b"".join(chunks)

        return await retrying(self._clock, self._retry, attempt)

    @async_to_deferred
    async def download_to_file(
        self, handle: Handle, path: str, local_path: str, *, on_progress: Progress | None = None
    ) -> None:
        """
        Stream ``path`` to the local file ``local_path`` without holding it in memory.

        Chunks go to a temporary file next to ``local_path`` that is renamed over it only once
        the whole body arrived; on failure it is removed and ``local_path`` is left untouched.
        """
        url = self._url(handle, "file").set("path", path)
        dest = os.path.abspath(local_path)

        async def attempt(deadline: float) -> None:
            response = await self._http.send("GET", url, timeout=deadline, service=False)
            await self._http.check(response, timeout=deadline, service=False)
            total = None if response.length is UNKNOWN_LENGTH else int(response.length)
            tmp = f"{os.path.dirname(dest)}/.{os.path.basename(dest)}.{os.urandom(6).hex()}.part"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                with open(fd, "wb") as f:
                    received = [0]

                    def sink(data: bytes) -> None:
                        f.write(data)
                        received[0] += len(data)
                        if on_progress is not None:
                            on_progress(received[0], total)

                    await self._http.read(response, sink, timeout=deadline, service=False)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

        await retrying(self._clock, self._retry, attempt)
