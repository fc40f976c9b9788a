"""The E2B front's control-plane bodies (REST, docs/e2b.rst): a ``Sandbox`` and a
``SandboxDetail``."""

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sandboxd.config import Config

if TYPE_CHECKING:
    from sandboxd.e2b.registry import E2BSandbox

# Control-plane bodies (REST)

ENVD_VERSION = "0.5.7"
"""The envd version the front advertises: commands with stdin and ``close_stdin``,
octet-stream and gzip uploads; not write metadata (0.6.2) nor watch entries (0.6.3)."""
CLIENT_ID = "sandboxd"


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def sandbox_json(entry: "E2BSandbox", domain: str | None = None) -> dict[str, Any]:
    """The ``Sandbox`` a create or connect answers (``domain``: where its port hosts are,
    ``SANDBOXD_E2B_DOMAIN``; its ``trafficAccessToken`` opens them, docs/e2b.rst, "Ports")."""
    return {
        "templateID": entry.template,
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": entry.token,
        "trafficAccessToken": entry.traffic_token,
        "domain": domain,
    }


def detail_json(config: Config, entry: "E2BSandbox") -> dict[str, Any]:
    """The ``SandboxDetail`` (and ``ListedSandbox``) of a sandbox under the replica's
    ``config`` (its limits); ``allowInternetAccess`` says whether its network mode reaches
    beyond its loopback (``egress``, ``host``)."""
    return {
        "templateID": entry.template,
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "startedAt": _when(entry.started_at),
        "endAt": _when(entry.end_at),
        "envdVersion": ENVD_VERSION,
        "cpuCount": max(1, math.ceil(config.cpu_cores)),
        "memoryMB": config.memory_max >> 20,
        "diskSizeMB": (config.disk_max or 0) >> 20,
        "state": "running",
        "metadata": entry.metadata,
        "allowInternetAccess": entry.sandbox.network != "none",
    }
