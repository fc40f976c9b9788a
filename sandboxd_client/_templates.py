"""
Templates of ``HttpSandbox`` (a base class of it): list, show, import, build and delete the
root filesystems a replica keeps (docs/extensions.rst, "Templates", "Building a template").

Templates belong to one replica: each call goes to ``base_url``, or to the replica whose
``pod_url`` is given (import a template on every replica that is to run it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from hyperlink import DecodedURL
from twisted.web.iweb import IResponse

from . import _tars
from . import _wire as wire
from ._base import OCTETS, ClientBase
from ._deferreds import async_to_deferred
from ._handles import check_base_url
from ._ndjson import LineSplitter
from ._transfers import Progress
from ._types import ProtocolError, TemplateBuildFailed, TemplateInfo, TemplateNotFound
from ._wire import JSON, json_bytes

REPLY_LIMIT = 1 << 20
"""Largest template record read (a few hundred bytes, its environment included)."""
FRAME_LIMIT = 1 << 20
"""Longest line of a build's progress read (a step's output line, or its end)."""
TAR = b"application/x-tar"


def decode_template(reply: object) -> TemplateInfo:
    """One template record → ``TemplateInfo`` (``ProtocolError`` when malformed)."""
    what = "template"
    obj = wire._obj(reply, what)
    env = wire._get(obj, "env", dict, what)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ProtocolError("template: env must map strings to strings")
    return TemplateInfo(
        name=wire._get(obj, "name", str, what),
        digest=wire._get(obj, "digest", str, what),
        size=wire._get(obj, "size", int, what),
        env=dict(env),
        workdir=wire._get(obj, "workdir", str, what),
        created=float(wire._get(obj, "created", (int, float), what)),
    )


def decode_templates(reply: object) -> list[TemplateInfo]:
    """``GET /templates`` → one ``TemplateInfo`` per template, by name."""
    return [
        decode_template(t)
        for t in wire._get(wire._obj(reply, "templates"), "templates", list, "templates")
    ]


class Templates(ClientBase):
    """The template routes of one replica."""

    def _templates_url(self, pod_url: str | None, *segments: str) -> DecodedURL:
        base = self._base if pod_url is None else check_base_url(pod_url)
        return base.child("templates", *segments)

    @async_to_deferred
    async def list_templates(self, pod_url: str | None = None) -> list[TemplateInfo]:
        """The templates of the replica at ``base_url`` (or at ``pod_url``)."""
        url = self._templates_url(pod_url)
        return decode_templates(await self._idempotent("GET", url, service=True))

    @async_to_deferred
    async def get_template(self, name: str, pod_url: str | None = None) -> TemplateInfo:
        """One template's record; ``TemplateNotFound`` when the replica has none of ``name``."""
        url = self._templates_url(pod_url, name)
        return decode_template(await self._idempotent("GET", url, service=True))

    @async_to_deferred
    async def delete_template(self, name: str, pod_url: str | None = None) -> None:
        """Delete a template; a retry that finds it already gone counts as done."""
        url = self._templates_url(pod_url, name)
        await self._idempotent("DELETE", url, service=True, gone_ok=TemplateNotFound)

    @async_to_deferred
    async def import_template(
        self,
        name: str,
        local_path: str,
        *,
        pod_url: str | None = None,
        on_progress: Progress | None = None,
        timeout: float = 3600.0,
    ) -> TemplateInfo:
        """
        Import the archive ``local_path`` (a root filesystem tarball, an OCI image layout in
        a tar, or a ``docker save`` archive) as template ``name``, streamed without reading it
        into memory. Sent once (a second attempt would find the name taken): ``timeout`` is
        the longest the upload and the import may take.
        """
        url = self._templates_url(pod_url, name)
        with open(local_path, "rb") as source:
            total = os.fstat(source.fileno()).st_size
            data = await self._put_stream(
                url, source, OCTETS, total, on_progress, timeout, service=True
            )
        try:
            reply: Any = json.loads(data[:REPLY_LIMIT])
        except (ValueError, UnicodeDecodeError):
            raise ProtocolError(f"template: reply is not JSON: {data[:80]!r}") from None
        return decode_template(reply)

    @async_to_deferred
    async def build_template(
        self,
        name: str,
        context_dir: str,
        *,
        pod_url: str | None = None,
        network: str | None = None,
        on_frame: Callable[[dict[str, Any]], object] | None = None,
        timeout: float = 3600.0,
    ) -> TemplateInfo:
        """
        Build template ``name`` from the local directory ``context_dir`` (its ``Dockerfile``
        at the top, the rest what ``COPY`` reads), packed as it is sent. ``on_frame`` is told
        each progress frame as it arrives (a step's start, each output line, the end);
        ``network`` ``host`` gives ``RUN`` the host's network (default: none). Sent once;
        ``TemplateBuildFailed`` when a step failed (nothing is left of the build).
        """
        url = self._templates_url(pod_url, name, "build")
        if network is not None:
            url = url.set("network", network)
        body = _tars.PackReader(_tars.pack(context_dir))
        response = await self._http.send(
            "POST",
            url,
            timeout=timeout,
            service=True,
            body=self._http.producer(body),  # type: ignore[arg-type]
            content_type=TAR,
        )
        return await self._built(response, on_frame, timeout)

    @async_to_deferred
    async def build_recipe(
        self,
        name: str,
        recipe: str,
        *,
        pod_url: str | None = None,
        network: str | None = None,
        on_frame: Callable[[dict[str, Any]], object] | None = None,
        timeout: float = 3600.0,
    ) -> TemplateInfo:
        """
        Build template ``name`` from one of the replica's built-in recipes (``recipe``:
        ``code-interpreter``, docs/extensions.rst, "Built-in recipes"): its Dockerfile, with
        the network its ``RUN`` needs unless ``network`` is given. Progress and failure as
        :meth:`build_template`'s.
        """
        payload: dict[str, Any] = {"recipe": recipe}
        if network is not None:
            payload["network"] = network
        response = await self._http.send(
            "POST",
            self._templates_url(pod_url, name, "build"),
            timeout=timeout,
            service=True,
            body=self._http.producer(json_bytes(payload)),
            content_type=JSON,
        )
        return await self._built(response, on_frame, timeout)

    async def _built(
        self,
        response: IResponse,
        on_frame: Callable[[dict[str, Any]], object] | None,
        timeout: float,
    ) -> TemplateInfo:
        """A build's answer read to its end: each frame to ``on_frame``, then the template
        (``TemplateBuildFailed`` when a step failed)."""
        await self._http.check(response, timeout=timeout, service=True)
        lines = LineSplitter(FRAME_LIMIT)
        ends: list[dict[str, Any]] = []

        def take(data: bytes) -> None:
            for line in lines.feed(data):
                frame = decode_frame(line)
                if frame and on_frame is not None:
                    on_frame(frame)
                if "end" in frame:
                    ends.append(frame)

        await self._http.read(response, take, timeout=timeout, service=True)
        if not ends:
            raise ProtocolError("template build: the answer ended before the build did")
        if ends[-1]["end"] != "built":
            raise TemplateBuildFailed(ends[-1])
        return decode_template(ends[-1].get("template"))


def decode_frame(line: bytes) -> dict[str, Any]:
    """One progress frame (``{}``: a keepalive); ``ProtocolError`` unless a JSON object."""
    try:
        frame = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(f"template build: a frame is not JSON: {line[:80]!r}") from None
    if not isinstance(frame, dict):
        raise ProtocolError("template build: a frame is not an object")
    return frame
