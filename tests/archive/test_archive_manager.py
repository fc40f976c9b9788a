"""The manager's use of the archive: ready only after restore, no-ops, a failed restore."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.python.threadpool import ThreadPool

from sandboxd.config import Config
from sandboxd.core.archive.rsync import WorkspaceEnd
from sandboxd.core.archive.store import Archive
from sandboxd.core.layout import Layout
from sandboxd.core.manager import SandboxManager
from sandboxd.core.sandbox import CreateRequest
from sandboxd.errors import ArchiveFailed
from sandboxd.isolation.none import no_isolation
from tests.archive.archive_helpers import reactor


class GatedArchive:
    """The real archive, except that each restore waits for the test to open the gate."""

    def __init__(self, real: Archive) -> None:
        self.real = real
        self.gate: Deferred[None] = Deferred()
        self.persists: list[tuple[str, bool]] = []

    def restore(self, item_id: str, end: WorkspaceEnd) -> Deferred[bool]:
        return self.gate.addCallback(lambda _: self.real.restore(item_id, end))

    def persist(self, item_id: str, end: WorkspaceEnd, delete: bool) -> Deferred[None]:
        self.persists.append((item_id, delete))
        return self.real.persist(item_id, end, delete)


@pytest.fixture
def manager(scratch: Path, archive: Archive, pool: ThreadPool) -> Iterator[SandboxManager]:
    config = Config.load({}, {"isolation": "none", "root": str(scratch / "root")})
    isolation = no_isolation(reactor(), pool, 4, None)
    layout = Layout(config.root, owns_files=False)
    gated: Any = GatedArchive(archive)
    layout.prepare_root()
    built = SandboxManager(config, reactor(), reactor(), isolation, pool, layout, archive=gated)
    pytest_twisted.blockon(built.start())
    yield built
    os.close(built._devnull)


@pytest_twisted.ensureDeferred
async def test_the_sandbox_is_ready_only_once_the_restore_is_complete(
    manager: SandboxManager, archive: Archive
) -> None:
    item = Path(archive.item("item"))
    item.mkdir()
    (item / "f").write_bytes(b"restored")
    creating = Deferred.fromCoroutine(manager.create_restored(CreateRequest(item_id="item")))
    assert not creating.called
    (sandbox,) = manager.sandboxes.values()
    assert not manager.is_ready(sandbox)
    assert await manager.persist(sandbox, delete=True) is False, "never while not ready"
    assert manager.archive.persists == []  # type: ignore[union-attr]

    manager.archive.gate.callback(None)  # type: ignore[union-attr]
    created = await creating
    assert created is sandbox
    assert manager.is_ready(sandbox)
    workspace = Path(manager.layout.workspace(sandbox.rid))
    assert (workspace / "f").read_bytes() == b"restored"
    assert await manager.persist(sandbox, delete=False) is True


@pytest_twisted.ensureDeferred
async def test_a_failed_restore_kills_the_sandbox(
    manager: SandboxManager, archive: Archive
) -> None:
    Path(archive.item("item")).write_bytes(b"a file where a directory belongs")
    manager.archive.gate.callback(None)  # type: ignore[union-attr]
    with pytest.raises(ArchiveFailed):
        await manager.create_restored(CreateRequest(item_id="item"))
    assert manager.sandboxes == {}
    assert manager.isolation.uids.free == 4
    assert os.listdir(manager.layout.root) == []


@pytest_twisted.ensureDeferred
async def test_without_item_id_nothing_is_restored_nor_persisted(
    manager: SandboxManager,
) -> None:
    sandbox = await manager.create_restored()
    assert not manager.is_ready(sandbox)
    manager.mark_ready(sandbox)
    assert await manager.persist(sandbox, delete=True) is False
    assert manager.archive.persists == []  # type: ignore[union-attr]
