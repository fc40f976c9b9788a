"""Where the cgroup hierarchies are, and where this process sits in each of them.

Reads the text of ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (given, not read here, so
tests pass their own). A cgroup path (as ``/proc/self/cgroup`` writes it) becomes a directory
by joining it to the mount point of its hierarchy, minus the part of the tree the mount hides
(the mount's root, not ``/`` for a bind-mounted subtree).
"""

import os
import re

from attrs import frozen

UNIFIED = ""
"""The key of the cgroup v2 line (``0::/path``) in :func:`parse_proc_cgroup`'s result."""

_ESCAPE = re.compile(r"\\([0-7]{3})")


@frozen
class Mount:
    """One cgroup or cgroup2 mount."""

    root: str
    """The cgroup path shown at the mount point (``/`` unless a subtree is bind-mounted)."""
    mountpoint: str
    fstype: str
    """``cgroup`` (v1) or ``cgroup2``."""
    options: frozenset[str]
    """Superblock options: the controllers of a v1 hierarchy, ``name=...``, ``rw``..."""


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts listed in ``/proc/self/mountinfo`` text, in order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 4:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mountpoint=_unescape(fields[4]),
                fstype=fstype,
                options=frozenset(fields[sep + 3].split(",")),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``{controller: cgroup path}`` from ``/proc/self/cgroup`` text; v2 is under ``UNIFIED``.

    A v1 line naming several controllers (``4:cpu,cpuacct:/x``) gives each of them the path.
    """
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths[UNIFIED] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def directory(mount: Mount, cgroup_path: str) -> str | None:
    """The directory of ``cgroup_path`` under ``mount``, or None when the mount does not show it."""
    root = mount.root.rstrip("/")
    if cgroup_path != root and not cgroup_path.startswith(root + "/"):
        return None
    rest = cgroup_path[len(root) :].strip("/")
    return os.path.join(mount.mountpoint, rest) if rest else mount.mountpoint


def v1_mount(mounts: list[Mount], controller: str) -> Mount | None:
    """The cgroup v1 mount carrying ``controller``, if any."""
    for mount in mounts:
        if mount.fstype == "cgroup" and controller in mount.options:
            return mount
    return None


def v2_mount(mounts: list[Mount]) -> Mount | None:
    """The cgroup2 mount, if any."""
    for mount in mounts:
        if mount.fstype == "cgroup2":
            return mount
    return None


def override_path(mounts: list[Mount], cgroup_root: str) -> str:
    """``SANDBOXD_CGROUP_ROOT`` as a cgroup path.

    It may be written as a cgroup path (``/sandboxd``, the same in every hierarchy) or as the
    directory of one (``/sys/fs/cgroup/sandboxd``, ``/sys/fs/cgroup/memory/sandboxd``): a
    leading mount point is replaced by that mount's root.
    """
    path = os.path.normpath(cgroup_root)
    for mount in sorted(mounts, key=lambda m: len(m.mountpoint), reverse=True):
        point = mount.mountpoint.rstrip("/")
        if path == point or path.startswith(point + "/"):
            rest = path[len(point) :].strip("/")
            base = mount.root.rstrip("/")
            return f"{base}/{rest}" if rest else (base or "/")
    return path
