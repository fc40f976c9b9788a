"""The routes of whole directory trees as tar streams (``files.tree``, docs/openapi.yaml):
``PUT /sandboxes/{rid}/tree`` unpacks a tar body below ``path``, ``GET`` answers the tree at
``path`` as a tar, a part at a time as the client takes it.

Both run in file threads as the sandbox (:meth:`~sandboxd.core.manager.SandboxManager.files`):
nothing outside the workspace, nor anything the sandbox's uid could not reach, is read or
written, and the sandbox's disk limits apply (``507``).
"""

from typing import TYPE_CHECKING

from twisted.logger import Logger
from twisted.web.iweb import IRequest

from sandboxd.core import normalise, tar_in, tar_out
from sandboxd.errors import SandboxdError
from sandboxd.http import parse, wire
from sandboxd.http.parse import query
from sandboxd.http.routing import app, authorized, capability, no_content
from sandboxd.web.paced import PacedWriter

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI

log = Logger()


@app.route("/sandboxes/<rid:rid>/tree", methods=["PUT"])
@authorized
@capability("files.tree")
async def upload_tree(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    """The body (spooled to disk as it came) is read member by member: one member's data in
    memory at a time."""
    sandbox = api.manager.get(rid)
    parts = normalise(query(request, "path", "/"))
    parse.refuse_too_large(request, api.manager.config.max_body)
    content = request.content
    content.seek(0)
    await api.manager.files(sandbox, lambda ws: tar_in.unpack(ws, parts, content))
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/tree", methods=["GET"])
@authorized
async def download_tree(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    """The first part is made before the status is sent (``404`` for a missing path); a
    failure after it ends the answer unfinished (the client never takes it whole)."""
    sandbox = api.manager.get(rid)
    parts = normalise(query(request, "path", "/"))
    uid = sandbox.identity.uid
    steppers: list[tar_out.Stepper] = []

    def first(ws: str) -> bytes | None:
        steppers.append(tar_out.Stepper(tar_out.pack(ws, parts, uid)))
        return steppers[0].step()

    try:
        part = await api.manager.files(sandbox, first)
        request.setHeader(b"content-type", wire.TAR)
        writer = PacedWriter(request)
        try:
            while part is not None and not writer.stopped:
                await writer.write(part)
                part = await api.manager.files(sandbox, lambda ws: steppers[0].step())
        except (OSError, SandboxdError) as e:
            log.warn("tree of {rid} cut short: {error}", rid=rid, error=e)
            request.loseConnection()  # type: ignore[attr-defined]
        finally:
            writer.close()
        return b""
    finally:
        for stepper in steppers:
            stepper.close()
