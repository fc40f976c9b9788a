"""The routes of the replica as a whole, not of one sandbox: health, readiness, drain,
metrics and tool resolution."""

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST
from twisted.logger import Logger
from twisted.web.iweb import IRequest

from sandboxd.core import Resolution
from sandboxd.http import parse, wire
from sandboxd.http.routing import app, authorized, capability, json_response, no_content

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI

log = Logger()


@app.route("/healthz", methods=["GET"])
async def healthz(api: "SandboxAPI", request: IRequest) -> bytes:
    # Answered once the kernels' probe is, which start-up runs in a thread: what it lists is
    # whole, and every other request is served meanwhile (docs/extensions.rst, "Contexts").
    capabilities = await api.capabilities_now()
    return json_response(request, wire.health_body(api.manager.draining, capabilities))


@app.route("/readyz", methods=["GET"])
def readyz(api: "SandboxAPI", request: IRequest) -> bytes:
    reason = None
    if api.manager.draining:
        reason = "draining"
    elif api.manager.recovering:
        reason = "reclaiming a predecessor's sandboxes"
    elif api.manager.isolation.uids.free == 0:
        reason = "no free uid"
    status, body = wire.readiness_body(reason, api.manager.isolation.name)
    return json_response(request, body, status)


@app.route("/drain", methods=["POST"])
@authorized
def drain(api: "SandboxAPI", request: IRequest) -> bytes:
    log.info("drain requested over HTTP")
    api.manager.draining = True
    api.on_drain()
    return no_content(request)


@app.route("/metrics", methods=["GET"])
@authorized
@capability("metrics")
def metrics(api: "SandboxAPI", request: IRequest) -> bytes:
    request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
    return api.manager.metrics.exposition()


# Third-party tools


@app.route("/tools/resolve", methods=["POST"])
@authorized
@capability("tools.resolve")
async def resolve_tools(api: "SandboxAPI", request: IRequest) -> bytes:
    wanted = parse.tools_body(parse.json_body(request))
    if api.tools is None:
        reason = "tool resolution is not available on this replica"
        return json_response(
            request, wire.tools_body(Resolution({}, dict.fromkeys(wanted, reason)))
        )
    return json_response(request, wire.tools_body(await api.tools.resolve(wanted)))
