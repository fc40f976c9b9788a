"""envd's ``filesystem.Filesystem`` service and ``/files`` on the core's file operations.

Every call runs in a file thread with the sandbox's filesystem credentials
(:meth:`SandboxManager.files`), on the workspace (``/home/user``) or the sandbox's own tmp
(``/tmp``); the core's functions never follow a symlink (a link is described by where it
leads, resolved in the sandbox's terms: :mod:`sandboxd.e2b.links`). Watches are the core's
workspace watch (:meth:`SandboxManager.watch`): streamed (``WatchDir``) or buffered for the
polling calls (``CreateWatcher``/``GetWatcherEvents``/``RemoveWatcher``).
"""

import secrets
import stat
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any, BinaryIO, TypeVar

from attrs import frozen
from twisted.web.iweb import IRequest

from sandboxd.core import (
    UPLOAD_PREFIX,
    Entry,
    Parts,
    SandboxManager,
    Source,
    WatchEvent,
    WorkspaceWatch,
    entries,
    workspace,
    write_in_place,
)
from sandboxd.e2b import links, wire
from sandboxd.e2b.links import Resolved
from sandboxd.e2b.paths import HOME, TMP, WORKSPACE, Place, place_of
from sandboxd.e2b.process import EnvelopeStream, keepalive_of
from sandboxd.e2b.registry import E2BSandbox
from sandboxd.e2b.upload import Upload
from sandboxd.e2b.wire import ConnectError, bool_field, int_field, text_field
from sandboxd.errors import PathNotFound, SandboxNotFound, TooManyEntries
from sandboxd.web.follow import DropWhilePaused

T = TypeVar("T")

FILE_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY"}
"""The types envd gives (a link has its target's, :mod:`sandboxd.e2b.links`)."""
EVENT_TYPES = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}
PERMISSION_BITS = 0o777
"""What envd's ``mode`` holds (Go's ``FileMode.Perm``): no type bit, no setuid/sticky."""
WATCHER_EVENTS_MAX = 10_000
"""Events a polling watcher keeps between two polls (the oldest go first)."""


async def in_place(
    manager: SandboxManager, entry: E2BSandbox, place: Place, work: Callable[[str, Parts], T]
) -> T:
    """``work(root, parts)`` in a file thread as the sandbox, ``root`` the place's directory;
    a missing path is named as the SDK named it."""
    rid = entry.id
    root = manager.layout.workspace(rid) if place.area == WORKSPACE else manager.layout.tmp(rid)
    try:
        return await manager.files(entry.sandbox, lambda _: work(root, place.parts))
    except PathNotFound:
        raise PathNotFound(f"{place.display}: no such file or directory") from None


def owner_name(entry: E2BSandbox, uid: int) -> str:
    """E2B's name for an owner: ``user`` for the sandbox's own uid, ``root`` for 0."""
    if uid == entry.sandbox.identity.uid:
        return "user"
    return "root" if uid == 0 else str(uid)


def permissions_of(mode: int) -> str:
    """The ``permissions`` text envd gives (Go's ``FileMode.String``: ``L`` for a link)."""
    text = stat.filemode(mode)
    return "L" + text[1:] if stat.S_ISLNK(mode) else text


def entry_info(
    entry: E2BSandbox, place: Place, found: Entry, link: Resolved | None = None
) -> dict[str, Any]:
    """An ``EntryInfo`` message of what is at ``place``, as envd gives it: ``mode`` holds the
    permission bits only (``0o755`` for a directory); a link (``link``: where it leads) has
    the type and permission bits of its target, and ``symlinkTarget``."""
    shown = found if link is None else link.found
    at = datetime.fromtimestamp(found.mtime_ns / 1e9, UTC)
    info: dict[str, Any] = {
        "name": place.name,
        "type": FILE_TYPES.get(shown.kind if shown else "", "FILE_TYPE_UNSPECIFIED"),
        "path": place.display,
        "size": found.size,
        "mode": 0 if shown is None else stat.S_IMODE(shown.mode) & PERMISSION_BITS,
        "permissions": permissions_of(found.mode),
        "owner": owner_name(entry, found.uid),
        "group": owner_name(entry, found.gid),
        "modifiedTime": at.isoformat().replace("+00:00", "Z"),
    }
    if link is not None:
        info["symlinkTarget"] = link.target
    return info


async def described(
    manager: SandboxManager, entry: E2BSandbox, place: Place, found: Entry
) -> dict[str, Any]:
    """:func:`entry_info` of ``found``, a link resolved first (:mod:`sandboxd.e2b.links`)."""
    if found.target is None:
        return entry_info(entry, place, found)
    layout = manager.layout
    host_places = {layout.workspace(entry.id): HOME, layout.tmp(entry.id): TMP}

    def stat_at(at: Place) -> Awaitable[Entry]:
        return in_place(manager, entry, at, entries.stat_entry)

    link = await links.resolve(stat_at, host_places, place, found.target)
    return entry_info(entry, place, found, link)


async def stat_(manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]) -> Any:
    place = place_of(message.get("path"))
    found = await in_place(manager, entry, place, entries.stat_entry)
    return {"entry": await described(manager, entry, place, found)}


LIST_DEPTH_MAX = 100
"""The deepest listing asked for (``invalid_argument`` past it; docs/e2b.rst, "Coverage")."""


async def list_dir(manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]) -> Any:
    """The entries under a directory down to ``depth`` levels: ``invalid_argument`` for a
    depth past :data:`LIST_DEPTH_MAX`, or an answer past
    :data:`~sandboxd.core.files.entries.LISTING_BYTES_MAX` (the SDK raises
    ``InvalidArgumentException`` with the message)."""
    place = place_of(message.get("path"))
    depth = int_field(message, "depth", 1)
    if depth > LIST_DEPTH_MAX:
        raise ConnectError("invalid_argument", f"depth: at most {LIST_DEPTH_MAX}")
    try:
        found = await in_place(manager, entry, place, lambda r, p: entries.list_dir(r, p, depth))
    except TooManyEntries as e:
        raise ConnectError("invalid_argument", f"{place.display}: {e.detail}") from None
    listed = []
    for item in found:
        child = Place(place.area, item.parts)
        listed.append(await described(manager, entry, child, item))
    return {"entries": listed}


async def make_dir(manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]) -> Any:
    place = place_of(message.get("path"))
    if not await in_place(manager, entry, place, entries.make_dir):
        raise ConnectError("already_exists", f"{place.display}: already exists")
    found = await in_place(manager, entry, place, entries.stat_entry)
    return {"entry": entry_info(entry, place, found)}


async def move(manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]) -> Any:
    source = place_of(message.get("source"), "source")
    target = place_of(message.get("destination"), "destination")
    if source.area != target.area:
        raise ConnectError("invalid_argument", "a move cannot cross /home/user and /tmp")
    await in_place(manager, entry, source, lambda r, p: workspace.rename(r, p, target.parts))
    found = await in_place(manager, entry, target, entries.stat_entry)
    return {"entry": await described(manager, entry, target, found)}


async def remove(manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]) -> Any:
    """Remove what is at the path; nothing there is no error (envd's ``os.RemoveAll``)."""
    place = place_of(message.get("path"))
    with suppress(PathNotFound):
        await in_place(manager, entry, place, entries.remove)
    return {}


def _watched(message: dict[str, Any]) -> Place:
    place = place_of(message.get("path"))
    if place.area != WORKSPACE:
        raise ConnectError("invalid_argument", "only paths under /home/user can be watched")
    return place


def watch_event(root: Place, event: WatchEvent) -> dict[str, Any] | None:
    """A ``FilesystemEvent`` (its name relative to the watched directory), or ``None`` for
    an event that has none (an overflow, an upload's temporary file)."""
    kind = EVENT_TYPES.get(event.kind)
    if kind is None or event.path is None:
        return None
    parts = tuple(p for p in event.path.split("/") if p)
    if parts and parts[-1].startswith(UPLOAD_PREFIX):
        return None  # an upload's temporary file: its rename into place is the target's event
    return {"name": "/".join(parts[len(root.parts) :]), "type": kind}


async def watch_dir(
    manager: SandboxManager, entry: E2BSandbox, request: IRequest, message: dict[str, Any]
) -> None:
    """``WatchDir``: a start event, then one event per change until the client goes."""
    place = _watched(message)
    stream: EnvelopeStream | None = None

    def dropped() -> None:
        assert stream is not None
        stream.write(wire.end_of_stream(wire.events_dropped()))
        stream.end()

    feed = DropWhilePaused(dropped)

    def deliver(event: WatchEvent) -> None:
        if stream is None:
            return  # only the "gone" of a sandbox killed while the watch starts (see below)
        if event.gone:
            stream.cut()
            return
        found = watch_event(place, event)
        if found is not None and feed.admits():
            stream.write(wire.envelope({"filesystem": found}))

    watch = await manager.watch(
        entry.sandbox, place.parts, bool_field(message, "recursive"), deliver
    )
    if watch.closed:  # the sandbox was killed while the watch started (its "gone" came first)
        raise SandboxNotFound(f"no sandbox {entry.id!r}")
    request.setResponseCode(200)
    request.setHeader(b"content-type", wire.CONNECT_JSON)
    request.write(wire.WATCH_START)
    stream = EnvelopeStream(request, manager.clock, keepalive_of(request), feed.pause, feed.resume)
    stream.keepalive_frame = wire.WATCH_KEEPALIVE
    try:
        stream.start()
        await stream.wait()
    finally:
        watch.close()


@frozen
class PollingWatcher:
    """A running watch whose events wait for the next ``GetWatcherEvents`` (at most
    :data:`WATCHER_EVENTS_MAX`: the oldest go first)."""

    watch: WorkspaceWatch
    events: deque[dict[str, Any]]

    def take(self) -> list[dict[str, Any]]:
        taken = list(self.events)
        self.events.clear()
        return taken

    def close(self) -> None:
        self.watch.close()


async def create_watcher(
    manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]
) -> Any:
    place = _watched(message)
    events: deque[dict[str, Any]] = deque(maxlen=WATCHER_EVENTS_MAX)

    def deliver(event: WatchEvent) -> None:
        found = watch_event(place, event)
        if found is not None:
            events.append(found)

    recursive = bool_field(message, "recursive")
    watch = await manager.watch(entry.sandbox, place.parts, recursive, deliver)
    watcher_id = secrets.token_hex(8)
    entry.watchers[watcher_id] = PollingWatcher(watch, events)
    return {"watcherId": watcher_id}


def _watcher(entry: E2BSandbox, message: dict[str, Any]) -> PollingWatcher:
    found = entry.watchers.get(text_field(message, "watcherId", ""))
    if not isinstance(found, PollingWatcher):
        raise ConnectError("not_found", "no such watcher")
    return found


async def get_watcher_events(
    manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]
) -> Any:
    """The events since the last call: what the kernel has queued is read first, so every
    change made before this call is in (as the SDK expects right after a write)."""
    watcher = _watcher(entry, message)
    watcher.watch.doRead()
    return {"events": watcher.take()}


async def remove_watcher(
    manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]
) -> Any:
    watcher = _watcher(entry, message)
    watcher.close()
    entry.watchers.pop(text_field(message, "watcherId"), None)
    return {}


# /files


async def read_file(
    manager: SandboxManager, entry: E2BSandbox, place: Place
) -> tuple[BinaryIO, int]:
    uid = entry.sandbox.identity.uid
    return await in_place(manager, entry, place, lambda r, p: workspace.open_for_reading(r, p, uid))


async def write_file(
    manager: SandboxManager, entry: E2BSandbox, place: Place, source: Source
) -> dict[str, str]:
    await in_place(manager, entry, place, lambda r, p: write_in_place(r, p, source))
    return {"name": place.name, "type": "file", "path": place.display}


async def write_upload(
    manager: SandboxManager, entry: E2BSandbox, upload: Upload
) -> list[dict[str, str]]:
    """Write each file of ``upload`` in turn, as it is read from the stored body: the body is
    read in file threads only (a chunk at a time, never on the reactor)."""
    written = []
    while found := await manager.files(entry.sandbox, lambda _: upload.next_file()):
        written.append(await write_file(manager, entry, *found))
    return written
