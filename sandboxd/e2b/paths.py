"""E2B paths onto a sandbox's places: ``/home/user`` is its workspace, ``/tmp`` its own tmp.

A relative path is relative to ``/home/user`` (the workspace). Any other absolute path is
refused (``invalid_argument``): it is never resolved on the host. Below the place, the path
is split by the core's :func:`~sandboxd.core.files.paths.normalise` (``..`` may not climb out).
"""

from attrs import frozen

from sandboxd.core import Parts, normalise
from sandboxd.e2b.wire import ConnectError
from sandboxd.errors import BadRequest

HOME = "/home/user"
TMP = "/tmp"
WORKSPACE = "workspace"
TMP_AREA = "tmp"
AREAS = {WORKSPACE: HOME, TMP_AREA: TMP}


@frozen
class Place:
    """A path in one of the sandbox's places (``workspace`` or ``tmp``)."""

    area: str
    parts: Parts

    @property
    def display(self) -> str:
        """The path as the SDK knows it (``/home/user/...``, ``/tmp/...``)."""
        return "/".join((AREAS[self.area], *self.parts))

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else AREAS[self.area].rsplit("/", 1)[-1]


def _under(path: str, top: str) -> str | None:
    if path == top:
        return ""
    if path.startswith(top + "/"):
        return path[len(top) + 1 :]
    return None


def place_of(path: object, field: str = "path") -> Place:
    """Where ``path`` is; ``invalid_argument`` for a path outside the sandbox's places."""
    if not isinstance(path, str):
        raise ConnectError("invalid_argument", f"{field}: must be a string")
    try:
        if not path.startswith("/"):
            return Place(WORKSPACE, normalise(path, field))
        squeezed = "/" + "/".join(p for p in path.split("/") if p and p != ".")
        for area, top in AREAS.items():
            rest = _under(squeezed, top)
            if rest is not None:
                return Place(area, normalise(rest, field))
    except BadRequest as e:
        raise ConnectError("invalid_argument", e.detail) from None
    raise ConnectError(
        "invalid_argument",
        f"{field}: {path!r} is outside the sandbox: only {HOME} (the workspace, also for "
        f"relative paths) and {TMP} are reachable",
    )


def cwd_of(path: object) -> Parts:
    """A command's working directory: in the workspace (``/tmp`` is not a cwd here)."""
    place = place_of(path, "cwd")
    if place.area != WORKSPACE:
        raise ConnectError("invalid_argument", f"cwd: must be under {HOME}")
    return place.parts
