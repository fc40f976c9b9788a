"""The routes of a sandbox's lifecycle: create, list, kill, stats, the ready marker and
persisting to the archive."""

from typing import TYPE_CHECKING

import attrs
from twisted.web.iweb import IRequest

from sandboxd.http import parse, wire
from sandboxd.http.routes import templates
from sandboxd.http.routing import app, authorized, capability, json_response, no_content

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI


@app.route("/sandboxes", methods=["POST"])
@authorized
async def create(api: "SandboxAPI", request: IRequest) -> bytes:
    body = parse.json_body(request)
    wanted = parse.create_request(body)
    if body.get("template") is not None:
        wanted = attrs.evolve(wanted, template=templates.template_root(api, body["template"]))
    sandbox = await api.manager.create_restored(wanted)
    return json_response(request, wire.created_body(own_url(api, request), sandbox))


def own_url(api: "SandboxAPI", request: IRequest) -> str:
    """This replica's directly addressable URL: configured, else ``POD_IP`` and our port.

    Without either, the address and port the request arrived at (this host as the caller
    reached it), ``https`` when it came over TLS.
    """
    if api.pod_url is not None:
        return api.pod_url.rstrip("/")
    local = request.getHost()
    host = str(api.pod_ip or getattr(local, "host", "127.0.0.1"))
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if request.isSecure() else "http"
    return f"{scheme}://{host}:{getattr(local, 'port', 80)}"


@app.route("/sandboxes", methods=["GET"])
@authorized
@capability("sandboxes.list")
def listing(api: "SandboxAPI", request: IRequest) -> bytes:
    return json_response(request, wire.sandboxes_body(api.manager.listing()))


@app.route("/sandboxes/<rid:rid>", methods=["DELETE"])
@authorized
async def kill(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    api.manager.get(rid)
    api.ports.forget(rid)  # its proxied connections closed, its public ports forgotten
    await api.manager.kill(rid)
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/fork", methods=["POST"])
@authorized
@capability("sandboxes.fork")
async def fork(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    """A new sandbox whose files are a copy of ``rid``'s (docs/extensions.rst, "Fork")."""
    sandbox = await api.manager.fork(api.manager.get(rid))
    return json_response(request, {"pod_url": own_url(api, request), "remote_id": sandbox.rid})


@app.route("/sandboxes/<rid:rid>/stats", methods=["GET"])
@authorized
@capability("sandboxes.stats")
def stats(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    usage = api.manager.stats(sandbox)
    disk = api.manager.disk_usage(sandbox)
    return json_response(request, wire.stats_body(usage, disk))


# Network (docs/isolation.rst, "Egress policy per sandbox")


@app.route("/sandboxes/<rid:rid>/network", methods=["GET"])
@authorized
def network(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    egress = api.manager.egress_policy(sandbox)
    return json_response(request, wire.network_body(sandbox.network, egress))


@app.route("/sandboxes/<rid:rid>/network", methods=["PUT"])
@authorized
def set_network(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    policy = parse.network_update(parse.json_body(request))
    egress = api.manager.set_egress(rid, policy)
    return json_response(request, wire.network_body(api.manager.get(rid).network, egress))


# Ready marker and archive


@app.route("/sandboxes/<rid:rid>/mark-ready", methods=["POST"])
@authorized
def mark_ready(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    api.manager.mark_ready(api.manager.get(rid))
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/ready", methods=["GET"])
@authorized
def ready(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    ready = api.manager.is_ready(api.manager.get(rid))
    return json_response(request, wire.field_body("ready", ready))


@app.route("/sandboxes/<rid:rid>/persist", methods=["POST"])
@authorized
async def persist(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    delete = parse.persist_body(parse.json_body(request))
    # No archive, no item_id, or not ready: a no-op, still 204 (docs/contract.rst, "Archive").
    await api.manager.persist(sandbox, delete)
    return no_content(request)
