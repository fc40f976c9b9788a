"""Helpers and fixtures of the tool tests: a real artifact store (twisted.web on 127.0.0.1,
port 0), real treq, real tarballs, and the real reactor."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.python.threadpool import ThreadPool
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from sandboxd.core.tools.fetch import Fetcher
from sandboxd.core.tools.resolver import ToolResolver

TOOL_SCRIPT = b'#!/bin/sh\necho "hello from the tool: $*"\n'
COMMANDS = [
    {
        "name": "greet",
        "description": "Say hello",
        "parameters": {"type": "object", "properties": {"who": {"type": "string"}}},
    }
]


def reactor() -> Any:
    from twisted.internet import reactor

    return reactor


def tarball(add: Callable[[tarfile.TarFile], None]) -> bytes:
    """A ``.tar.gz`` whose members ``add`` writes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        add(tar)
    return buffer.getvalue()


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def add_entry(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    tar.addfile(info)


def good_tool(tar: tarfile.TarFile) -> None:
    add_entry(tar, "bin", tarfile.DIRTYPE)
    add_file(tar, "bin/greet", TOOL_SCRIPT, 0o700)
    add_file(tar, "share/doc/README", b"docs", 0o600)
    add_entry(tar, "bin/hello", tarfile.SYMTYPE, "greet")


GOOD = tarball(good_tool)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(artifact_url: str, digest: str, version: str = "1.0.0") -> bytes:
    return json.dumps(
        {
            "name": "greeter",
            "version": version,
            "artifact": {"url": artifact_url, "sha256": digest},
            "commands": COMMANDS,
        }
    ).encode()


class Gate:
    """Holds requests for one path until :meth:`open` (to make resolutions overlap)."""

    def __init__(self) -> None:
        self.opened: Deferred[None] = Deferred()
        self.waiting = 0


class Store(Resource):
    """The artifact store: path → bytes (or a status), counting each request."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, bytes] = {}
        self.statuses: dict[str, int] = {}
        self.gates: dict[str, Gate] = {}
        self.stall_after: dict[str, int] = {}
        self.hits: dict[str, int] = {}

    def render_GET(self, request: Any) -> Any:
        path = request.path.decode()
        self.hits[path] = self.hits.get(path, 0) + 1
        if path in self.statuses:
            request.setResponseCode(self.statuses[path])
            return b"no"
        if path not in self.files:
            request.setResponseCode(404)
            return b"not found"
        data = self.files[path]
        if path in self.stall_after:  # send part, then nothing more (never finishes)
            request.setHeader(b"content-length", str(len(data)).encode())
            request.write(data[: self.stall_after[path]])
            return NOT_DONE_YET
        gate = self.gates.get(path)
        if gate is None:
            return data
        gate.waiting += 1

        def release(_: object) -> None:
            request.write(data)
            request.finish()

        gate.opened.addCallback(release)
        return NOT_DONE_YET


class Server:
    """A listening :class:`Store`; ``url(path)`` is its address for a path."""

    def __init__(self) -> None:
        self.store = Store()
        self.site = Site(self.store)
        self.port = reactor().listenTCP(0, self.site, interface="127.0.0.1")
        self.base = f"http://127.0.0.1:{self.port.getHost().port}"

    def url(self, path: str) -> str:
        return self.base + path

    def publish(self, name: str, artifact: bytes, digest: str | None = None) -> str:
        """Serve a tool under ``/{name}/``; returns its manifest URL."""
        self.store.files[f"/{name}/tool.tar.gz"] = artifact
        digest = sha256(artifact) if digest is None else digest
        self.store.files[f"/{name}/manifest.json"] = manifest("tool.tar.gz", digest)
        return self.url(f"/{name}/manifest.json")

    def stop(self) -> Deferred[Any]:
        return self.port.stopListening()


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    try:
        yield running
    finally:
        if running.port.connected:
            pytest_twisted.blockon(running.stop())


def dead_url(path: str = "/manifest.json") -> str:
    """An address nothing listens on (connection refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory sandbox uids may pass through (0711)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxd-tools-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pool() -> Iterator[ThreadPool]:
    threads = ThreadPool(minthreads=0, maxthreads=2, name="tools-tests")
    threads.start()
    try:
        yield threads
    finally:
        threads.stop()


@pytest.fixture
def http() -> Iterator[HTTPClient]:
    connections = HTTPConnectionPool(reactor(), persistent=False)
    yield HTTPClient(Agent(reactor(), pool=connections))


@pytest.fixture
def make_resolver(scratch: Path, pool: ThreadPool, http: HTTPClient) -> Callable[..., ToolResolver]:
    """Builds resolvers over one tools directory (a new one = the daemon after a restart)."""

    def build(**limits: Any) -> ToolResolver:
        fetcher = Fetcher(http, reactor(), header_timeout=limits.pop("header_timeout", 5.0))
        resolver = ToolResolver(str(scratch / "tools"), fetcher, reactor(), pool, **limits)
        resolver.prepare()
        return resolver

    return build


@pytest.fixture
def resolver(make_resolver: Callable[..., ToolResolver]) -> ToolResolver:
    return make_resolver()


def modes(root: Path) -> dict[str, int]:
    found = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                found[os.path.relpath(full, root)] = os.stat(full).st_mode & 0o7777
    return found
