"""The JSON bodies of the HTTP front (docs/contract.rst, docs/extensions.rst): every answer
body the routes send that is not an error nor a stream."""

import json
from collections.abc import Iterable
from typing import Any

import sandboxd
from sandboxd.core import (
    CgroupStats,
    Context,
    DiskUsage,
    Process,
    ProcessListing,
    Resolution,
    Sandbox,
    SandboxListing,
    Template,
)
from sandboxd.isolation.network.egress_policy import EgressPolicy

NDJSON = b"application/x-ndjson"
TAR = b"application/x-tar"


def body(value: Any) -> bytes:
    """A JSON body, as ``json.dumps`` writes it."""
    return json.dumps(value).encode()


# Lifecycle bodies


def created_body(pod_url: str, sandbox: Sandbox) -> dict[str, Any]:
    """``POST /sandboxes``: where the new sandbox is served, and its id."""
    return {"pod_url": pod_url, "remote_id": sandbox.rid}


def stats_body(usage: CgroupStats, disk: DiskUsage) -> dict[str, Any]:
    """``GET stats``: what the cgroup and the disk layer count of the sandbox."""
    return {
        "memory_bytes": usage.memory_bytes,
        "memory_peak_bytes": usage.memory_peak_bytes,
        "cpu_usec": usage.cpu_usec,
        "pids": usage.pids,
        "oom_kills": usage.oom_kills,
        "cpus": None if usage.cpus is None else list(usage.cpus),
        "disk_bytes": disk.bytes,
        "disk_limit_bytes": disk.bytes_limit,
        "files": disk.files,
        "files_limit": disk.files_limit,
    }


def sandboxes_body(listing: Iterable[SandboxListing]) -> dict[str, Any]:
    """``GET /sandboxes``: every live sandbox, for operators (its id as ``remote_id``)."""
    return {
        "sandboxes": [
            {
                "remote_id": s.rid,
                "created": s.created,
                "last_active": s.last_active,
                "ready": s.ready,
                "execs": s.execs,
                "network": network_body(s.network, s.egress),
                "template": s.template,
            }
            for s in listing
        ]
    }


def network_body(mode: str, egress: EgressPolicy | None) -> dict[str, Any]:
    """A sandbox's network: its mode and, for a mode that takes one, its egress policy."""
    body: dict[str, Any] = {"mode": mode}
    if egress is not None:
        body.update(egress.to_json())
    return body


# The replica's own bodies


def health_body(draining: bool, capabilities: list[str]) -> dict[str, Any]:
    """``GET /healthz``: alive (``ok``, or ``draining``), its version and capabilities."""
    return {
        "status": "draining" if draining else "ok",
        "version": sandboxd.__version__,
        "capabilities": capabilities,
    }


def readiness_body(reason: str | None, isolation: str) -> tuple[int, dict[str, Any]]:
    """``GET /readyz``: ``503`` with the ``reason`` it takes no sandbox, else ``200`` naming
    its isolation."""
    if reason is not None:
        return 503, {"ready": False, "reason": reason}
    return 200, {"ready": True, "isolation": isolation}


def tools_body(answer: Resolution) -> dict[str, Any]:
    """``POST /tools/resolve``: ``{tools: {name: {sha, version, stale, commands}}, refused:
    {name: reason}}``."""
    tools = {
        name: {"sha": t.sha, "version": t.version, "stale": t.stale, "commands": t.commands}
        for name, t in answer.tools.items()
    }
    return {"tools": tools, "refused": answer.refused}


def field_body(name: str, value: object) -> dict[str, Any]:
    """A body of one field: ``{"ready": ...}``, ``{"exists": ...}``, ``{"size": ...}``..."""
    return {name: value}


# Background processes (docs/extensions.rst, "Background processes")


def process_started_body(process: Process) -> dict[str, Any]:
    """``POST processes``: the new process's id and pid."""
    return {"id": process.id, "pid": process.pid}


def processes_body(processes: Iterable[Process]) -> dict[str, Any]:
    """``GET processes``: every record of the sandbox, oldest first."""
    return {"processes": [process_json(p.listing()) for p in processes]}


def process_json(listed: ProcessListing) -> dict[str, Any]:
    """One record of ``GET processes``."""
    return {
        "id": listed.id,
        "pid": listed.pid,
        "tag": listed.tag,
        "cmd": list(listed.cmd),
        "started": listed.started,
        "running": listed.running,
        "exit": listed.exit,
        **({} if listed.pty is None else {"pty": {"rows": listed.pty[0], "cols": listed.pty[1]}}),
    }


# Templates (docs/extensions.rst, "Templates")


def template_body(template: Template) -> dict[str, Any]:
    """One template: ``{name, digest, size, env, workdir, created}``."""
    return {
        "name": template.name,
        "digest": template.digest,
        "size": template.size,
        "env": template.env,
        "workdir": template.workdir,
        "created": template.created,
    }


def templates_body(templates: Iterable[Template]) -> dict[str, Any]:
    """``GET /templates``: every template, by name."""
    return {"templates": [template_body(template) for template in templates]}


# Ports (docs/extensions.rst, "Ports")


def port_body(url: str, public: bool) -> dict[str, Any]:
    """A port's answer: where it is reached through this replica, and whether it is public."""
    return {"url": url, "public": public}


# Contexts (docs/extensions.rst, "Contexts")


def context_body(context: Context) -> dict[str, str]:
    """A context as ``POST /contexts`` and ``GET /contexts`` show it."""
    return context.describe()


# Terminals (docs/extensions.rst, "Terminals")


def terminal_body(process: Process) -> dict[str, Any]:
    """``POST terminals``: the new terminal's id, pid and size (its listing)."""
    return process_json(process.listing())


def terminals_body(processes: Iterable[Process]) -> dict[str, Any]:
    """``GET terminals``: the sandbox's terminals (the records of its processes that run on
    a terminal), oldest first."""
    listed = [p.listing() for p in processes]
    return {"terminals": [process_json(each) for each in listed if each.pty is not None]}
