"""The routes of a sandbox's lifecycle: create, list, kill, stats, the ready marker and
persisting to the archive."""

from typing import TYPE_CHECKING

from twisted.web.iweb import IRequest

from sandboxd.http import parse
from sandboxd.http.routes import templates
from sandboxd.http.routing import app, authorized, capability, json_response, no_content

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI


@app.route("/sandboxes", methods=["POST"])
@authorized
async def create(api: "SandboxAPI", request: IRequest) -> bytes:
    body = parse.json_body(request)
    env, item_id = parse.create_body(body)
    template = None
    if body.get("template") is not None:
        template = templates.template_root(api, body["template"])
    # The network mode is the core's to check (which modes this replica offers and allows).
    sandbox = await api.manager.create_restored(
        env=env, item_id=item_id, network=body.get("network"), template=template
    )
    return json_response(request, {"pod_url": own_url(api, request), "remote_id": sandbox.rid})


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
    return json_response(request, {"sandboxes": api.manager.listing()})


@app.route("/sandboxes/<rid:rid>", methods=["DELETE"])
@authorized
async def kill(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    api.manager.get(rid)
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
    return json_response(
        request,
        {
            "memory_bytes": usage.memory_bytes,
            "memory_peak_bytes": usage.memory_peak_bytes,
            "cpu_usec": usage.cpu_usec,
            "pids": usage.pids,
            "oom_kills": usage.oom_kills,
            "disk_bytes": disk.bytes,
            "disk_limit_bytes": disk.bytes_limit,
            "files": disk.files,
            "files_limit": disk.files_limit,
        },
    )


# Ready marker and archive


@app.route("/sandboxes/<rid:rid>/mark-ready", methods=["POST"])
@authorized
def mark_ready(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    api.manager.mark_ready(api.manager.get(rid))
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/ready", methods=["GET"])
@authorized
def ready(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    return json_response(request, {"ready": api.manager.is_ready(api.manager.get(rid))})


@app.route("/sandboxes/<rid:rid>/persist", methods=["POST"])
@authorized
async def persist(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    delete = parse.persist_body(parse.json_body(request))
    # No archive, no item_id, or not ready: a no-op, still 204 (docs/contract.rst, "Archive").
    await api.manager.persist(sandbox, delete)
    return no_content(request)
