"""The template store's own logic on real files, with a clock and a synchronous pool: names,
records read back at start-up, what a stopped daemon left removed, conflicts, a template in
use, and a failed import leaving nothing."""

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from sandboxd.assemble import _templates
from sandboxd.config import Config
from sandboxd.core.layout import Layout
from sandboxd.core.templates.store import DIRECTORY, TemplateStore, check_name
from sandboxd.errors import BadArchive, BadRequest, TemplateConflict, TemplateNotFound
from tests.support.fakes import SyncPool
from tests.templates.archives import file, tar

ARCHIVE = tar([file("hello", b"world")])


class ThreadlessClock(Clock):
    """A clock that is also the reactor a synchronous pool calls back through."""

    def callFromThread(self, f: Any, *args: Any, **kwargs: Any) -> None:
        f(*args, **kwargs)

    def addSystemEventTrigger(self, phase: str, event: str, f: Any) -> Any:
        """Kept in :attr:`shutdown` (``before``, ``shutdown``: what a build adds)."""
        assert (phase, event) == ("before", "shutdown")
        self.shutdown.append(f)
        return f

    def removeSystemEventTrigger(self, handle: Any) -> None:
        self.shutdown.remove(handle)

    @property
    def shutdown(self) -> list[Any]:
        """The ``before shutdown`` triggers added and not removed."""
        return self.__dict__.setdefault("_shutdown", [])


def result(deferred: Deferred[Any]) -> Any:
    """What a Deferred that has fired gave (its failure raised)."""
    outcome: list[Any] = []
    deferred.addBoth(outcome.append)
    (value,) = outcome
    if hasattr(value, "raiseException"):
        value.raiseException()
    return value


def store_at(root: Path, limit: int = 1 << 20) -> TemplateStore:
    clock = ThreadlessClock()
    clock.advance(1_750_000_000)
    return TemplateStore.open(str(root), limit, False, clock, SyncPool())


def put(store: TemplateStore, name: str, archive: bytes = ARCHIVE) -> Any:
    return result(ensureDeferred(store.put(name, io.BytesIO(archive))))


@pytest.mark.parametrize("name", ["base", "python:3.12", "a.b_c-d:Tag_1.x", "0"])
def test_good_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "Base", ".x", "_x", "a/b", "a:", "a:b:c", "x" * 65, "a b"])
def test_bad_names(name: str) -> None:
    with pytest.raises(BadRequest, match="is not a template name"):
        check_name(name)


def test_templates_are_read_back_when_the_store_is_opened_again(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    template = put(store, "base")
    assert template.created == 1_750_000_000
    assert (tmp_path / DIRECTORY).stat().st_mode & 0o777 == 0o700
    assert store_at(tmp_path).listing() == [template]
    assert store.rootfs(template) == str(tmp_path / DIRECTORY / "base" / "rootfs")


def test_leftovers_are_removed_and_broken_records_passed_over(tmp_path: Path) -> None:
    directory = tmp_path / DIRECTORY
    for leftover in (".import-0123", ".delete-4567"):
        (directory / leftover / "rootfs").mkdir(parents=True)
        (directory / leftover / "rootfs" / "file").write_bytes(b"x")
    (directory / "broken").mkdir()
    (directory / "broken" / "template.json").write_text("{not json")
    (directory / "odd").mkdir()
    (directory / "odd" / "template.json").write_text(json.dumps({"name": "odd"}))
    (directory / "Not-A-Name").mkdir()
    with capturedLogs() as events:
        store = store_at(tmp_path)
    assert store.listing() == []
    assert sorted(os.listdir(directory)) == ["Not-A-Name", "broken", "odd"]
    assert sum("left by a stopped daemon" in str(e["log_format"]) for e in events) == 2
    assert sum("passed over" in str(e["log_format"]) for e in events) == 2


def test_a_taken_name_is_a_conflict(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    put(store, "base")
    with pytest.raises(TemplateConflict, match="template 'base' exists"):
        put(store, "base")


def test_a_name_being_imported_is_a_conflict(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store._busy.add("base")
    with pytest.raises(TemplateConflict, match="template 'base' exists"):
        put(store, "base")


def test_a_failed_import_leaves_nothing(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    with pytest.raises(BadArchive):
        put(store, "bad", tar([file("../x")]))
    assert os.listdir(tmp_path / DIRECTORY) == []
    assert store.listing() == []
    assert put(store, "bad").name == "bad"  # the name is free again


def test_a_template_in_use_is_not_deleted(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    put(store, "base")
    store.users = lambda name: 2 if name == "base" else 0
    with pytest.raises(TemplateConflict, match="template 'base' is used by 2 sandboxes"):
        result(ensureDeferred(store.delete("base")))
    assert store.get("base").name == "base"
    store.users = lambda name: 0
    result(ensureDeferred(store.delete("base")))
    with pytest.raises(TemplateNotFound, match="no template named 'base'"):
        store.get("base")
    assert os.listdir(tmp_path / DIRECTORY) == []


def test_no_store_where_the_state_root_cannot_hold_one(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    config = Config.load({}, {"root": str(tmp_path / "file")})
    with capturedLogs() as events:
        assert (
            _templates(config, Clock(), SyncPool(), Layout(str(tmp_path / "file"), False)) is None
        )
    assert any("templates: unavailable" in str(e["log_format"]) for e in events)


def test_the_store_directory_is_made_by_the_first_import_only(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    assert not (tmp_path / DIRECTORY).exists()
    assert store.listing() == []
    old = os.umask(0o022)  # a umask that would leave it readable by others
    try:
        put(store, "first")
    finally:
        os.umask(old)
    assert (tmp_path / DIRECTORY).stat().st_mode & 0o777 == 0o700


def test_a_missing_state_root_cannot_hold_a_store(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        store_at(tmp_path / "missing")


class HeldPool:
    """A pool whose work waits until :meth:`run_all` (an import still running)."""

    def __init__(self) -> None:
        self.held: list[Any] = []

    def callInThreadWithCallback(self, on_result: Any, f: Any, *a: Any, **kw: Any) -> None:
        self.held.append((on_result, f, a, kw))

    def run_all(self) -> None:
        while self.held:
            on_result, f, a, kw = self.held.pop(0)
            SyncPool().callInThreadWithCallback(on_result, f, *a, **kw)


def test_an_import_whose_caller_left_goes_on_whole(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.pool = HeldPool()
    source = io.BytesIO(ARCHIVE)
    answer = store.put("left", source)
    answer.cancel()  # the HTTP client went
    with pytest.raises(CancelledError):
        result(answer)
    store.pool.run_all()
    assert store.get("left").size == len(b"world")
    assert source.closed
    assert sorted(os.listdir(tmp_path / DIRECTORY)) == ["left"]


def test_a_failed_import_no_one_waits_for_is_logged(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.pool = HeldPool()
    answer = store.put("bad", io.BytesIO(tar([file("../x")])))
    answer.cancel()
    with pytest.raises(CancelledError):
        result(answer)
    with capturedLogs() as events:
        store.pool.run_all()
    assert any("import of {name} failed" in str(e["log_format"]) for e in events)
    assert os.listdir(tmp_path / DIRECTORY) == []
