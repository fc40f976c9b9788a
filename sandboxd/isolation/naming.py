"""Names in the cgroup tree: the per-daemon instance directory and the sandbox directories."""

import hashlib
import os
import re

RID = re.compile(r"[0-9a-f]{16}\Z")
"""A sandbox id as the manager makes them: 16 lowercase hex digits (``secrets.token_hex(8)``),
and nothing after them (``match`` and ``fullmatch`` alike; a trailing newline is not one). The
one pattern of a sandbox id: the state root's directories, the pins' and the URL's."""


def check_rid(rid: str) -> str:
    """``rid`` itself when it is a well-formed sandbox id, else ``ValueError``.

    Sandbox ids become directory names under the delegated subtree: nothing else (``..``, ``/``,
    a controller file name) may get there.
    """
    if not isinstance(rid, str) or RID.fullmatch(rid) is None:
        raise ValueError(f"{rid!r} is not a sandbox id (16 lowercase hex digits)")
    return rid


def is_rid(name: str) -> bool:
    """Whether a directory name is a sandbox id."""
    return RID.fullmatch(name) is not None


def instance_name(state_root: str) -> str:
    """``sandboxd-<12 hex>``: the directory of one daemon's sandboxes, derived from its root.

    Daemons with different state roots (tests run many at once) never see each other's
    cgroups; a daemon restarted on the same root finds its predecessor's, for recovery.
    """
    canonical = os.path.normpath(os.path.abspath(state_root))
    return "sandboxd-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]
