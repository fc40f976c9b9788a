"""The twisted.web site: a request class that refuses bodies over the configured limit.

twisted.web reads a whole request body before the handler runs (under 100 000 bytes in memory,
larger in an unlinked temporary file). A body declared or found to be larger than ``max_body``
is discarded as it arrives instead, so nothing over the limit is stored anywhere, and the
handler answers ``413 TooLarge``.
"""

from typing import Any

from twisted.web.resource import IResource
from twisted.web.server import Request, Site


class _Discard:
    """A content file that drops what it is given."""

    def write(self, data: bytes) -> None:
        """Drop the data."""

    def seek(self, *args: Any) -> int:
        return 0

    def read(self, *args: Any) -> bytes:
        return b""

    def close(self) -> None:
        """Nothing to close."""


class LimitedRequest(Request):
    """A request that keeps at most ``max_body`` bytes of body; ``too_large`` says it had more."""

    max_body: int = 1 << 62
    too_large: bool = False
    _received: int = 0

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.max_body:
            self._refuse()
        else:
            super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large:
            return
        self._received += len(data)
        if self._received > self.max_body:
            if self.content is not None:
                self.content.close()
            self._refuse()
            return
        super().handleContentChunk(data)

    def _refuse(self) -> None:
        self.too_large = True
        self.content = _Discard()


def make_site(resource: IResource, max_body: int) -> Site:
    """A site whose requests refuse bodies over ``max_body`` bytes."""
    request_class = type("SandboxdRequest", (LimitedRequest,), {"max_body": max_body})
    site = Site(resource, requestFactory=request_class)
    site.displayTracebacks = False
    return site
