"""Bodies spooled in the place of the sandbox their request names (``SpoolPlace``): each front's
rule naming the place, and the request that spools there, charged, and is aborted by the
sandbox's end until its body is stored.

The kernel's side (the sandbox's quota counting the spool, the state root's free space left
alone) is ``tests/kernel/test_spool_quota.py``.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from attrs import define, field
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyChannel

from sandboxd.e2b import signing
from sandboxd.e2b.admit import spool_places as e2b_spool_places
from sandboxd.e2b.registry import Registry
from sandboxd.http.api import spool_places
from sandboxd.web.site import SPOOL_MIN, Spool, Utf8URLs, make_site
from sandboxd.web.spool import SpoolThreads, SpoolWriter
from tests.unit.test_unit_spool import Now, Request, StepPool

T = TypeVar("T")


@define
class Place:
    """A sandbox's place that records the work charged to it."""

    directory: str
    bodies: set[Callable[[], object]] = field(factory=set)
    charges: int = 0

    def charged(self, work: Callable[[], T]) -> Callable[[], T]:
        self.charges += 1
        return work


def placed(
    tmp_path: Path, place: Place | None, threads: bool = True, spool_dir: bool = True
) -> tuple[Request, StepPool, StringTransport, list[tuple[bytes, Headers]]]:
    """A request on a site whose rule names ``place`` for every request (recorded)."""
    asked: list[tuple[bytes, Headers]] = []

    def rule(path: bytes, headers: Headers) -> Place | None:
        asked.append((path, headers))
        return place

    pool = StepPool()
    channel: Any = DummyChannel()
    channel.transport = transport = StringTransport()
    channel._command, channel._path = b"PUT", b"/sandboxes/s1/file?path=f"  # its request line
    channel.site = make_site(
        Utf8URLs(Resource()),
        1 << 20,
        spool_dir=str(tmp_path / "shared") if spool_dir else None,
        spool_threads=SpoolThreads(Now(), pool) if threads else None,
        spool_place=rule,
    )
    (tmp_path / "shared").mkdir(exist_ok=True)
    return Request(channel), pool, transport, asked


def test_a_large_body_is_spooled_in_its_sandboxs_place_charged(tmp_path: Path) -> None:
    place = Place(str(tmp_path))
    request, pool, _, asked = placed(tmp_path, place)
    request.requestHeaders.addRawHeader(b"e2b-sandbox-id", b"s1")
    request.gotLength(None)
    assert asked == [(b"/sandboxes/s1/file?path=f", request.requestHeaders)]
    writer = request.content
    assert isinstance(writer, SpoolWriter) and isinstance(writer.file, Spool)
    assert os.readlink(f"/proc/self/fd/{writer.file.fileno()}").startswith(str(tmp_path) + "/")
    assert place.charges == 1 and len(place.bodies) == 1  # its opening
    request.handleContentChunk(b"abc")
    pool.step()
    assert place.charges == 2  # and its write
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    assert request.handled == b"abc"
    assert place.bodies == set()  # stored: the sandbox's end no longer aborts it
    request.close_content()


def test_the_sandboxs_end_aborts_a_body_still_arriving(tmp_path: Path) -> None:
    place = Place(str(tmp_path))
    request, pool, transport, _ = placed(tmp_path, place)
    request.gotLength(SPOOL_MIN)
    request.handleContentChunk(b"abc")
    (abort,) = place.bodies
    abort()
    assert transport.disconnected
    request.connectionLost(Failure(ConnectionDone()))
    assert place.bodies == set()
    abort()  # once the connection is gone: nothing to do
    pool.step()  # the write in flight returns: the spool is closed


def test_a_body_received_before_it_is_written_is_aborted_until_written(
    tmp_path: Path,
) -> None:
    place = Place(str(tmp_path))
    request, pool, _, _ = placed(tmp_path, place)
    request.gotLength(None)
    request.handleContentChunk(b"abc")
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    assert len(place.bodies) == 1
    pool.step()
    assert place.bodies == set() and request.handled == b"abc"
    request.close_content()


def test_without_threads_the_place_is_let_go_once_the_body_is_in(tmp_path: Path) -> None:
    place = Place(str(tmp_path))
    request, _, _, _ = placed(tmp_path, place, threads=False)
    request.gotLength(None)
    assert isinstance(request.content, Spool)
    request.handleContentChunk(b"abc")
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    assert request.handled == b"abc" and place.bodies == set()
    request.close_content()


def test_small_bodies_and_sites_without_unnamed_files_use_no_place(tmp_path: Path) -> None:
    place = Place(str(tmp_path))
    small, _, _, asked = placed(tmp_path, place)
    small.gotLength(SPOOL_MIN - 1)
    assert asked == [] and place.bodies == set()
    request, _, _, asked = placed(tmp_path, place, spool_dir=False)
    request.gotLength(None)
    assert asked == [] and place.bodies == set()
    request.connectionLost(Failure(ConnectionDone()))


def test_a_request_naming_no_sandbox_is_spooled_where_the_site_spools(tmp_path: Path) -> None:
    request, _, _, asked = placed(tmp_path, None)
    request.gotLength(None)
    writer = request.content
    assert len(asked) == 1 and isinstance(writer, SpoolWriter)
    assert os.readlink(f"/proc/self/fd/{writer.file.fileno()}").startswith(
        str(tmp_path / "shared") + "/"
    )
    request.connectionLost(Failure(ConnectionDone()))


def test_a_place_that_cannot_take_the_body_fails_it(tmp_path: Path) -> None:
    place = Place(str(tmp_path / "gone"))
    request, _, _, _ = placed(tmp_path, place)
    request.gotLength(None)
    assert isinstance(request.content_error, FileNotFoundError)
    assert place.bodies == set()


# The fronts' rules


class Manager:
    """The manager's side: the place of each sandbox it holds (its id, here)."""

    sandboxes: dict[str, object] = {}

    def body_place(self, rid: str) -> str | None:
        return f"place of {rid}" if rid in ("s1", "s2") else None


def test_the_native_front_names_the_sandbox_of_the_path() -> None:
    place: Any = spool_places(Manager())  # type: ignore[arg-type]
    assert place(b"/sandboxes/s1/file?path=x", Headers()) == "place of s1"
    assert place(b"/sandboxes/s2/tree", Headers()) == "place of s2"
    assert place(b"/sandboxes/gone/file", Headers()) is None
    assert place(b"/sandboxes", Headers()) is None
    assert place(b"/drain", Headers()) is None
    assert place(b"sandboxes/s1/file", Headers()) is None


class Held:
    rid = "s1"
    lives_until = 0.0


def registry() -> Registry:
    """A registry holding ``s1`` (access token ``good``) of :class:`Manager`."""
    held = Registry(manager=Manager(), clock=Clock())  # type: ignore[arg-type]
    held.add(Held(), "base", {}, 60).token = "good"  # type: ignore[arg-type]
    return held


def headers(**values: str) -> Headers:
    return Headers({k.replace("_", "-").encode(): [v.encode()] for k, v in values.items()})


def signed(token: str, expiration: str = "") -> bytes:
    path = "/home/user/f"
    stamp = int(expiration) if expiration.isdigit() else None
    mark = signing.signature(path, signing.WRITE, "user", token, stamp)
    fields = {"path": path, "username": "user", "signature": mark}
    if expiration:
        fields["signature_expiration"] = expiration
    return f"/files?{urlencode(fields)}".encode()


def test_the_e2b_front_names_the_sandbox_whose_token_the_request_carries() -> None:
    place: Any = e2b_spool_places(registry())
    good = headers(e2b_sandbox_id="s1", x_access_token="good")
    assert place(b"/files?path=f", good) == "place of s1"
    assert place(b"/filesystem.Filesystem/Stat", good) == "place of s1"
    assert place(b"/v2/sandboxes", good) is None  # the control plane: no sandbox's
    assert place(b"/files?path=f", headers(e2b_sandbox_id="s1", x_access_token="bad")) is None
    assert place(b"/files?path=f", headers(e2b_sandbox_id="s9", x_access_token="good")) is None
    assert place(b"/files?path=f", headers(e2b_sandbox_id="s1")) is None


def test_the_e2b_front_names_the_sandbox_that_signed_the_url() -> None:
    place: Any = e2b_spool_places(registry())
    assert place(signed("good"), Headers()) == "place of s1"
    assert place(signed("good"), headers(e2b_sandbox_id="s1")) == "place of s1"
    assert place(signed("bad"), Headers()) is None
    assert place(signed("good", expiration="soon"), Headers()) is None  # malformed
