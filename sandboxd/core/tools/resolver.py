"""``POST /tools/resolve``: third-party tools, resolved one by one, installed once.

For each ``name → manifest_url``: fetch the manifest (bounded size and time,
:mod:`sandboxd.core.tools.fetch`), validate it (:mod:`sandboxd.core.tools.manifest`), and unless
``{tools_dir}/{sha}`` is installed already, fetch the artifact (bounded), check its sha256, and
unpack it (:mod:`sandboxd.core.tools.unpack`). The answer is per tool: a tool that fails goes to
``refused`` with a reason, the others still resolve, and the request as a whole never fails.

Two resolutions that need the same sha at the same time share one download and one unpack.
Each success is remembered per manifest URL in ``{tools_dir}/resolutions.json`` (0600: manifest
URLs may carry credentials), written atomically, read at start-up. When the store is unreachable
(:class:`~sandboxd.core.tools.fetch.StoreUnreachable`: no connection, a timeout, a ``5xx``), the
last success for that URL is answered with ``stale: true`` if its sha is still installed; with
nothing remembered, the tool is refused. An answer of the store that is wrong (``404``,
malformed, digest mismatch, unsafe archive) is refused even when something is remembered.
"""

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from attrs import define, field, frozen
from twisted.internet.defer import Deferred, DeferredLock, gatherResults
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from sandboxd.core.tools.fetch import Fetcher, StoreUnreachable, ToolRefused, check_url
from sandboxd.core.tools.manifest import Manifest
from sandboxd.core.tools.unpack import TEMP, UnpackLimits, install

MEMORY = "resolutions.json"

log = Logger()


@frozen
class Resolved:
    """One resolved tool, as answered."""

    sha: str
    version: str
    commands: list[dict[str, Any]]
    stale: bool = False
    """Answered from memory while the store is unreachable."""


@frozen
class Resolution:
    """The answer to one request: each tool resolved, or refused with its reason."""

    tools: dict[str, Resolved]
    refused: dict[str, str]


@define
class ToolResolver:
    """Resolves tools into ``tools_dir``; blocking disk work runs in ``pool``."""

    tools_dir: str
    fetcher: Fetcher
    reactor: Any
    pool: ThreadPool
    manifest_limit: int = 1 << 20
    manifest_timeout: float = 30.0
    artifact_limit: int = 512 << 20
    artifact_timeout: float = 600.0
    unpack_limits: UnpackLimits = field(factory=UnpackLimits)
    unavailable: str | None = None
    """Why tools cannot be installed on this replica (every tool is refused with it)."""
    _memory: dict[str, dict[str, Any]] = field(factory=dict, init=False)
    _installing: dict[str, list[Deferred[None]]] = field(factory=dict, init=False)
    _writing: DeferredLock = field(factory=DeferredLock, init=False)

    def prepare(self) -> None:
        """Create ``tools_dir`` (0755: sandboxes read tools, never change them), empty its
        private ``.tmp``, and read what was remembered; on failure, refuse every tool."""
        try:
            os.makedirs(self.tools_dir, mode=0o755, exist_ok=True)
            os.chmod(self.tools_dir, 0o755)
            staging = os.path.join(self.tools_dir, TEMP)
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(staging):
                    path = os.path.join(staging, name)
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.unlink(path)
            os.makedirs(staging, mode=0o700, exist_ok=True)
            os.chmod(staging, 0o700)
        except OSError as e:
            self.unavailable = f"the tools directory {self.tools_dir} is unusable: {e.strerror}"
            log.error("tools: {reason}; every tool will be refused", reason=self.unavailable)
            return
        self._memory = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            with open(os.path.join(self.tools_dir, MEMORY), "rb") as f:
                loaded = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warn("tools: cannot read remembered resolutions ({e}); starting afresh", e=e)
            return {}
        if not isinstance(loaded, dict):
            return {}
        return {k: v for k, v in loaded.items() if isinstance(v, dict)}

    def installed(self, sha: str) -> bool:
        return os.path.isdir(os.path.join(self.tools_dir, sha))

    async def resolve(self, tools: Mapping[str, object]) -> Resolution:
        """Each tool of ``{name: manifest_url}`` resolved, or refused with its reason."""
        names = list(tools)
        work = [Deferred.fromCoroutine(self._one(tools[name])) for name in names]
        outcomes = await gatherResults(work)
        answer = Resolution({}, {})
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, Resolved):
                answer.tools[name] = outcome
            else:
                log.info("tools: {name} refused: {reason}", name=name, reason=outcome)
                answer.refused[name] = outcome
        return answer

    async def _one(self, url: object) -> Resolved | str:
        """One tool: its resolution, or the reason it is refused."""
        if self.unavailable is not None:
            return self.unavailable
        try:
            manifest_url = check_url(url, "manifest")
            return await self._resolve(manifest_url)
        except StoreUnreachable as e:
            return self._stale(str(url), e)
        except ToolRefused as e:
            return str(e)
        except Exception as e:
            log.failure("tools: resolving {url} failed", Failure(), url=url)
            return f"internal error: {e}"

    def _stale(self, url: str, problem: StoreUnreachable) -> Resolved | str:
        remembered = self._memory.get(url)
        if remembered is None:
            return f"{problem}; no earlier resolution to fall back on"
        sha = remembered.get("sha")
        if not isinstance(sha, str) or not self.installed(sha):
            return f"{problem}; the earlier resolution is no longer installed"
        log.warn("tools: {url} answered from memory (stale): {problem}", url=url, problem=problem)
        return Resolved(
            sha, str(remembered.get("version", "")), remembered.get("commands", []), stale=True
        )

    async def _resolve(self, url: str) -> Resolved:
        raw = bytearray()
        await self.fetcher.fetch(
            url, "manifest", self.manifest_limit, self.manifest_timeout, raw.extend
        )
        manifest = Manifest.parse(bytes(raw), url)
        if not self.installed(manifest.sha256):
            await self._install_once(manifest)
        resolved = Resolved(manifest.sha256, manifest.version, manifest.commands)
        await self._remember(url, manifest.name, resolved)
        return resolved

    def _install_once(self, manifest: Manifest) -> Deferred[None]:
        """Download and unpack ``manifest``'s artifact, sharing a run already under way."""
        sha = manifest.sha256
        mine: Deferred[None] = Deferred()
        waiting = self._installing.get(sha)
        if waiting is not None:
            waiting.append(mine)
            return mine
        self._installing[sha] = [mine]

        def finished(result: Failure | None) -> None:
            for waiter in self._installing.pop(sha):
                if isinstance(result, Failure):
                    waiter.errback(result)
                else:
                    waiter.callback(None)

        Deferred.fromCoroutine(self._install(manifest)).addBoth(finished)
        return mine

    async def _install(self, manifest: Manifest) -> None:
        staging = os.path.join(self.tools_dir, TEMP)
        digest = hashlib.sha256()
        with tempfile.TemporaryFile(dir=staging) as artifact:

            def keep(chunk: bytes) -> None:
                digest.update(chunk)
                artifact.write(chunk)

            await self.fetcher.fetch(
                manifest.artifact_url, "artifact", self.artifact_limit, self.artifact_timeout, keep
            )
            got = digest.hexdigest()
            if got != manifest.sha256:
                raise ToolRefused(
                    f"artifact: sha256 {got} does not match the manifest's {manifest.sha256}"
                )
            artifact.flush()
            await deferToThreadPool(
                self.reactor,
                self.pool,
                install,
                self.tools_dir,
                manifest.sha256,
                artifact,
                self.unpack_limits,
            )
        log.info("tools: installed {name} {sha}", name=manifest.name, sha=manifest.sha256)

    async def _remember(self, url: str, name: str, resolved: Resolved) -> None:
        entry = {
            "name": name,
            "sha": resolved.sha,
            "version": resolved.version,
            "commands": resolved.commands,
        }
        if self._memory.get(url) == entry:
            return
        self._memory[url] = entry
        await self._writing.acquire()
        try:
            snapshot = json.dumps(self._memory, sort_keys=True).encode()
            await deferToThreadPool(self.reactor, self.pool, self._write_memory, snapshot)
        except OSError as e:
            log.warn("tools: cannot save resolutions ({e})", e=e)
        finally:
            self._writing.release()

    def _write_memory(self, data: bytes) -> None:
        final = os.path.join(self.tools_dir, MEMORY)
        fd, temp = tempfile.mkstemp(prefix=MEMORY + ".", dir=os.path.join(self.tools_dir, TEMP))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temp, 0o600)
            os.rename(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise


def build_tools(tools_dir: str, reactor: Any, pool: ThreadPool) -> ToolResolver:
    """The resolver of the daemon: treq over a pooled ``Agent`` (http and https), its
    directory prepared (an unusable one is logged and refuses every tool)."""
    from treq.client import HTTPClient
    from twisted.web.client import Agent, HTTPConnectionPool

    agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=True))
    resolver = ToolResolver(tools_dir, Fetcher(HTTPClient(agent), reactor), reactor, pool)
    resolver.prepare()
    return resolver
