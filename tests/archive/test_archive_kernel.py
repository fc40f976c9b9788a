"""The archive and tools with real isolation: cgroup v1, real uids, as root (in process)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from sandboxd.config import Config
from sandboxd.core.archive.store import Archive, build_archive
from sandboxd.core.layout import Layout
from sandboxd.core.manager import Sandbox, SandboxManager
from sandboxd.core.sandbox import CreateRequest
from sandboxd.http import parse, wire
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.select import Host, build_isolation
from tests.archive.archive_helpers import all_bytes, reactor

pytestmark = pytest.mark.kernel

SETTINGS = {
    "isolation": "cgroup1",
    "uid-min": "236300",
    "uid-max": "236302",
    "memory-max": "256M",
    "pids-max": "64",
}
TOOL_SHA = "c0" * 32
HOST = Host(set_oom_score_adj=lambda value: None)
"""The real host, except that the test runner keeps its own ``oom_score_adj``."""


@pytest.fixture
def kernel(scratch: Path) -> Iterator[tuple[SandboxManager, Archive]]:
    if os.geteuid() != 0:
        pytest.skip("real uids and cgroups need root")
    from twisted.python.threadpool import ThreadPool

    options = {
        **SETTINGS,
        "root": str(scratch / "root"),
        "tools-dir": str(scratch / "tools"),
    }
    config = Config.load({}, options)
    files = ThreadPool(minthreads=1, maxthreads=2, name="archive-kernel-files")
    admin = ThreadPool(minthreads=0, maxthreads=2, name="archive-kernel-admin")
    try:
        isolation = build_isolation(config, reactor(), files, HOST)
    except IsolationUnavailable as e:
        pytest.skip(f"cgroup1 isolation unavailable here: {e}")
    files.start()
    admin.start()
    archive = build_archive(str(scratch / "archive"), reactor(), admin)
    layout = Layout(config.root, owns_files=True)
    layout.prepare_root()
    manager = SandboxManager(
        config, reactor(), reactor(), isolation, admin, layout, archive=archive
    )
    pytest_twisted.blockon(manager.start())
    try:
        yield manager, archive
    finally:
        try:
            for rid in list(manager.sandboxes):
                pytest_twisted.blockon(Deferred.fromCoroutine(manager.kill(rid)))
        finally:
            files.stop()
            admin.stop()
            os.close(manager._devnull)
            remove_instance = getattr(isolation.cgroups, "remove_instance", None)
            if remove_instance is not None:
                remove_instance()
            isolation.namespaces.close()


async def run(manager: SandboxManager, sandbox: Sandbox, body: dict[str, Any]) -> dict[str, Any]:
    execution = manager.start_exec(sandbox, parse.exec_spec(body), lambda fd, data: None)
    return wire.final_frame(await execution.when_finished())


def out(frame: dict[str, Any]) -> str:
    return base64.b64decode(frame["out"]).decode()


@pytest_twisted.ensureDeferred
async def test_restored_files_belong_to_the_sandbox_and_persist_reads_as_it(
    kernel: tuple[SandboxManager, Archive], scratch: Path
) -> None:
    manager, archive = kernel
    item = Path(archive.item("item"))
    (item / "src").mkdir(parents=True)
    (item / "src" / "main.py").write_bytes(b"print(1)\n")
    (item / "notes").write_bytes(b"notes")
    (item / "shadow").symlink_to("/etc/shadow")

    sandbox = await manager.create_restored(CreateRequest(item_id="item"))

    uid, gid = sandbox.identity.uid, sandbox.identity.gid
    assert uid >= 236300
    workspace = Path(manager.layout.workspace(sandbox.rid))
    for top, dirs, names in os.walk(workspace):
        for name in [*dirs, *names]:
            st = os.lstat(os.path.join(top, name))
            assert (st.st_uid, st.st_gid) == (uid, gid), name
    assert manager.is_ready(sandbox)
    frame = await run(manager, sandbox, {"cmd": ["sh", "-c", "id -u; cat src/main.py"]})
    assert out(frame) == f"{uid}\nprint(1)\n"

    # The sandbox plants links to host files and a file it makes unreadable to root's eye.
    plant = "ln -s /etc/passwd passwd-link && ln -s /root rootdir && echo mine > mine"
    assert (await run(manager, sandbox, {"cmd": ["sh", "-c", plant]}))["exit"] == 0
    assert await manager.persist(sandbox, delete=True) is True

    stored = Path(archive.item("item"))
    assert (stored / "mine").read_bytes() == b"mine\n"
    assert os.readlink(stored / "passwd-link") == "/rsyncd-munged//etc/passwd"
    assert Path("/etc/passwd").read_bytes() not in all_bytes(stored)
    for top, _, names in os.walk(stored):
        for name in names:
            assert os.lstat(os.path.join(top, name)).st_uid == 0, "the archive is root's"


@pytest_twisted.ensureDeferred
async def test_an_installed_tool_runs_as_the_sandbox_through_tools(
    kernel: tuple[SandboxManager, Archive],
) -> None:
    manager, _ = kernel
    tools = Path(manager.config.tools_dir)
    (tools / TOOL_SHA / "bin").mkdir(parents=True)
    for path in (tools, tools / TOOL_SHA, tools / TOOL_SHA / "bin"):
        path.chmod(0o755)
    tool = tools / TOOL_SHA / "bin" / "whoami-tool"
    tool.write_bytes(b"#!/bin/sh\nid -u\n")
    tool.chmod(0o755)
    sandbox = manager.create()

    frame = await run(manager, sandbox, {"cmd": ["whoami-tool"], "tools": [TOOL_SHA]})
    assert frame["exit"] == 0, frame
    assert out(frame) == f"{sandbox.identity.uid}\n"
    change = {"cmd": ["sh", "-c", f"echo x > {tool}"], "tools": [TOOL_SHA]}
    assert (await run(manager, sandbox, change))["exit"] != 0, "tools are read-only to sandboxes"
