"""Symlinks as envd describes them: by what they lead to, never followed on the host.

envd states a link by its target (``os.Stat`` of ``filepath.EvalSymlinks``): the type and
permission bits are the target's, ``symlinkTarget`` its absolute resolved path; a link
that leads nowhere keeps its own path as the target and an unspecified type. Here a link is
resolved in the sandbox's own terms: its text is joined to the link's directory (``/home/
user/...`` or ``/tmp/...``; the host paths of the workspace and tmp, as a command without
the mount namespace writes them, mean the same), the result must be one of the sandbox's
places (:func:`~sandboxd.e2b.paths.place_of`), and it is stated with the core's no-follow
calls, hop by hop. A target outside the places, missing, or behind a link in the middle
of the path leads nowhere.
"""

import posixpath
from collections.abc import Awaitable, Callable, Mapping

from attrs import frozen

from sandboxd.core import Entry
from sandboxd.e2b.paths import Place, place_of
from sandboxd.e2b.wire import ConnectError
from sandboxd.errors import SandboxdError

HOPS_MAX = 40
"""Links followed at most in one resolution (Linux's own bound)."""

StatAt = Callable[[Place], Awaitable[Entry]]
"""The entry at a place, not followed (``PathNotFound`` when there is none)."""


@frozen
class Resolved:
    """Where a link leads: the path envd would name (``symlinkTarget``), and what is there
    (``None``: nothing the sandbox may see)."""

    target: str
    found: Entry | None


def _seen_as(path: str, host_places: Mapping[str, str]) -> str:
    """``path`` with a host path of one of the sandbox's places written as the SDK's."""
    for host, shown in host_places.items():
        if path == host or path.startswith(host + "/"):
            return shown + path[len(host) :]
    return path


async def resolve(
    stat_at: StatAt, host_places: Mapping[str, str], link: Place, text: str
) -> Resolved:
    """Where the link at ``link`` whose text is ``text`` leads; ``host_places`` maps the host
    paths of the sandbox's places to the SDK's (``/home/user``, ``/tmp``)."""
    here, hops = link, 0
    while hops < HOPS_MAX:
        hops += 1
        joined = posixpath.join(posixpath.dirname(here.display), _seen_as(text, host_places))
        joined = posixpath.normpath(joined)
        try:
            here = place_of(joined)
            found = await stat_at(here)
        except (ConnectError, SandboxdError):
            break
        if found.target is None:
            return Resolved(here.display, found)
        text = found.target
    return Resolved(link.display, None)
