"""How to reach the daemon, from its ``SANDBOXD_LISTEN`` endpoint string: the line start-up
prints for a person (``curl http://127.0.0.1:8080/healthz``)."""

import re

_UNSPECIFIED = ("", "0.0.0.0", "::")


def _fields(endpoint: str) -> tuple[str, list[str], dict[str, str]]:
    """The endpoint's type, positional and keyword fields (``\\:`` is a colon in a field)."""
    parts = [p.replace("\\:", ":") for p in re.split(r"(?<!\\):", endpoint)]
    positional: list[str] = []
    keywords: dict[str, str] = {}
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if sep:
            keywords[key] = value
        else:
            positional.append(part)
    return parts[0].lower(), positional, keywords


def reach_hint(endpoint: str, port: int | None = None) -> str:
    """One line for the log: where the daemon listens and a command that reaches it.

    ``port``: the port really bound (for ``tcp:0``); else the endpoint's own.
    """
    kind, positional, keywords = _fields(endpoint)
    if kind in ("tcp", "tcp6"):
        bound = port if port is not None else int(keywords.get("port") or positional[0])
        interface = keywords.get("interface", "::" if kind == "tcp6" else "")
        where = f"{interface} port {bound}" if interface not in _UNSPECIFIED else f"port {bound}"
        host = interface if interface not in _UNSPECIFIED else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        url = f"http://{host}:{bound}"
        scope = "" if interface not in _UNSPECIFIED else " on every address"
        return (
            f"listening on {where}{scope}: try  curl {url}/healthz  or  "
            f"SANDBOXD_URL={url} sandboxctl create"
        )
    if kind == "unix":
        path = keywords.get("address") or positional[0]
        return (
            f"listening on the unix socket {path}: try  curl --unix-socket {path} http://x/healthz"
        )
    return f"listening on {endpoint}"
