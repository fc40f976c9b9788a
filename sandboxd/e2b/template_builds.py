"""The E2B front's template builds (docs/e2b.rst, "Building templates"): what the SDK's
``Template.build`` asks, one call after another, kept between them.

A build is *requested* (its name, a build id), then the SDK asks where to upload the files of
each ``COPY`` (an upload link on the front itself, carrying the build's upload token: the
rule at the headers admits it, :meth:`TemplateBuilds.upload_admitted`), uploads them (each
kept as the file the site spooled it to, never in memory), and *triggers* the build: its steps
are read (:mod:`~sandboxd.e2b.template_steps`), the uploads assembled into one context tar in
the state root, and the core's builder runs it (:func:`sandboxd.core.start_build`) while the
SDK polls its status and logs. Its other names (its ``tags``) are then made as builds ``FROM``
it. Uploads are closed (their space given back) once the build has ended, or once a build
not triggered is forgotten.

What is kept is bounded: :data:`BUILDS_MAX` builds (the oldest ended, or waiting past
:data:`WAIT_MAX`, forgotten first), :data:`UPLOADS_MAX` uploads, :data:`LOG_MAX` log
entries and :data:`LOG_BYTES_MAX` bytes of them a build.
"""

import hmac
import os
import secrets
import tempfile
import uuid
from collections.abc import Callable
from typing import IO, Any

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from sandboxd.core import (
    BuildEvent,
    BuildFailed,
    StepOutput,
    StepStarted,
    Template,
    TemplateStore,
    start_build,
)
from sandboxd.e2b.template_steps import BASE_STEP, FILES_HASH, assemble_context, read_plan
from sandboxd.e2b.wire import RestError
from sandboxd.errors import SandboxdError

log = Logger()

WAITING, BUILDING, READY, ERROR = "waiting", "building", "ready", "error"
BUILDS_MAX = 32
UPLOADS_MAX = 256
LOG_MAX = 10_000
LOG_BYTES_MAX = 1 << 20
"""Bytes of log text a build keeps (past either bound its log is cut: what a build whose
client never polls costs the daemon)."""
WAIT_MAX = 3600.0
"""Seconds a requested build may wait to be triggered before it may be forgotten."""
REASON_ENTRIES = 20
"""The last log entries a failed build's reason repeats."""


def _ignored(event: BuildEvent) -> None:
    """What a copy's build reports: not logged (a failure raises)."""


def context_file(directory: str) -> IO[bytes]:
    """A new unnamed file in ``directory`` (the state root) for a build's context: its
    space given back when it is closed."""
    return tempfile.TemporaryFile(dir=directory)


@frozen
class LogEntry:
    """One line of a build's log: when (seconds, the daemon's clock), its level (``info``,
    ``warn``, ``error``), its text and the E2B step it is of (``None``: the build's own)."""

    timestamp: float
    level: str
    message: str
    step: str | None = None


def template_id_of(name: str) -> str:
    """A template's E2B id: its name without its tag."""
    return name.partition(":")[0]


@define
class E2BBuild:
    """One build: its id, its template's ``name`` (and its other names, ``tags``), what it
    holds of the SDK's uploads, its status, log and a failed build's reason."""

    id: str
    name: str
    others: tuple[str, ...]
    token: str
    """What its upload links carry (secret, compared in constant time)."""
    requested: float
    status: str = WAITING
    uploads: dict[str, IO[bytes] | None] = field(factory=dict)
    """Each upload asked for by its files' hash: the file once uploaded."""
    log: list[LogEntry] = field(factory=list)
    log_bytes: int = 0
    log_cut: bool = False
    reason: tuple[str, str, tuple[LogEntry, ...]] | None = None
    """A failed build's message, its E2B step and its last log entries."""

    @property
    def template_id(self) -> str:
        return template_id_of(self.name)

    @property
    def ended(self) -> bool:
        return self.status in (READY, ERROR)

    def close_uploads(self) -> None:
        for upload in self.uploads.values():
            if upload is not None:
                upload.close()
        self.uploads.clear()


@define
class TemplateBuilds:
    """The front's builds, on the replica's template ``store`` and its clock."""

    store: TemplateStore
    clock: Any
    network: str = "none"
    """The network of its builds' ``RUN`` steps (``SANDBOXD_BUILD_NETWORK``)."""
    builds: dict[str, E2BBuild] = field(factory=dict)

    # Request, uploads

    def request(self, name: str, tags: list[str]) -> E2BBuild:
        """A new build of ``name`` (``name`` or ``name:tag``), and of ``name:tag`` for each of
        ``tags`` (made once it is built); ``409`` if one is a template already. An earlier
        build of ``name`` that waits for its trigger is forgotten (its uploads closed)."""
        names = [name]
        for tag in tags:
            other = f"{template_id_of(name)}:{tag}"
            if other not in names:
                names.append(other)
        for each in names:
            if each in self.store.templates:
                raise RestError(409, f"template {each!r} exists (delete it first)")
        for earlier in list(self.builds.values()):
            if earlier.name == name and earlier.status == WAITING:
                self._forget(earlier)  # a program that stopped before its trigger, run again
        self._forget_old()
        build = E2BBuild(
            str(uuid.uuid4()),
            names[0],
            tuple(names[1:]),
            secrets.token_urlsafe(24),
            self.clock.seconds(),
        )
        self.builds[build.id] = build
        return build

    def _forget(self, build: E2BBuild) -> None:
        build.close_uploads()
        del self.builds[build.id]

    def _forget_old(self) -> None:
        now = self.clock.seconds()
        for build in list(self.builds.values()):
            if len(self.builds) < BUILDS_MAX:
                return
            if build.ended or (build.status == WAITING and now - build.requested > WAIT_MAX):
                self._forget(build)
        if len(self.builds) >= BUILDS_MAX:
            raise RestError(429, f"{BUILDS_MAX} template builds are under way: retry later")

    def get(self, template_id: str, build_id: str) -> E2BBuild:
        """Build ``build_id`` of template ``template_id`` (``404``)."""
        build = self.builds.get(build_id)
        if build is None or build.template_id != template_id:
            raise RestError(404, f"no build {build_id!r} of template {template_id!r}")
        return build

    def upload_link(self, template_id: str, files_hash: str) -> tuple[E2BBuild, str]:
        """The waiting build of ``template_id`` these files are for, and the path and query
        of their upload link (``present`` is never true: nothing is cached)."""
        if FILES_HASH.match(files_hash) is None:
            raise RestError(400, "hash: must be the files' sha256 in hex")
        waiting = [
            b for b in self.builds.values() if b.template_id == template_id and b.status == WAITING
        ]
        if not waiting:
            raise RestError(404, f"no build of template {template_id!r} waits for its files")
        build = waiting[-1]
        if files_hash not in build.uploads and len(build.uploads) >= UPLOADS_MAX:
            raise RestError(400, f"a build takes at most {UPLOADS_MAX} uploads")
        build.uploads.setdefault(files_hash, None)
        return build, f"/templates/{template_id}/files/{files_hash}/upload?build={build.id}"

    def uploading(self, build_id: str | None, token: str | None, files_hash: str) -> E2BBuild:
        """The build an upload is for, its token checked (``401``), waiting for these files
        (``404``)."""
        build = self.builds.get(build_id or "")
        if build is None or not hmac.compare_digest((token or "").encode(), build.token.encode()):
            raise RestError(401, "this upload link is not valid")
        if build.status != WAITING or files_hash not in build.uploads:
            raise RestError(404, "this build does not wait for these files")
        return build

    def upload_admitted(self, query: dict[str, str], files_hash: str) -> bool:
        """Whether an upload's link (its ``query``) is one this front gave, for a build that
        waits for these files: asked at the headers, before a byte of the body is stored."""
        try:
            self.uploading(query.get("build"), query.get("token"), files_hash)
        except RestError:
            return False
        return True

    def keep_upload(self, build: E2BBuild, files_hash: str, upload: IO[bytes]) -> None:
        """The uploaded files (a second upload of them replaces the first)."""
        previous = build.uploads.get(files_hash)
        if previous is not None:
            previous.close()
        build.uploads[files_hash] = upload

    # The build

    async def trigger(self, build: E2BBuild, body: dict[str, Any]) -> None:
        """Start ``build`` with the template the SDK sent (``400`` naming a step that does not
        map, or whose files were not uploaded; ``409`` once started). It runs on after the
        answer; its end is its status."""
        if build.status != WAITING:
            raise RestError(409, f"build {build.id} was started already")
        context = None
        try:
            plan = read_plan(body, lambda name: name in self.store.templates)
            for copy in plan.copies:
                if build.uploads.get(copy.files_hash) is None:
                    raise RestError(400, f"step {copy.step}: its files were not uploaded")
            build.status = BUILDING
            for note in plan.notes:
                self._log(build, "warn", note)
            sources: dict[str, list[str]] = {}
            if plan.copies:
                context = context_file(os.path.dirname(self.store.directory))
                uploads = [(c, build.uploads[c.files_hash]) for c in plan.copies]
                sources = await self.store.in_thread(assemble_context, context, uploads)
            text, steps = plan.dockerfile(sources)
            running = start_build(
                self.store, build.name, text, context, self.network, self._emit(build, steps)
            )
        except Exception as e:
            if context is not None:
                context.close()
            reason = e.message if isinstance(e, RestError) else str(e)
            self._fail(build, reason, BASE_STEP)
            build.close_uploads()
            raise
        ended = Deferred.fromCoroutine(running.run())
        ended.addBoth(lambda result: self._end(build, isinstance(result, Template), context))

    def _emit(self, build: E2BBuild, steps: list[str]) -> Callable[[BuildEvent], None]:
        def emit(event: BuildEvent) -> None:
            if isinstance(event, StepStarted):
                step = steps[event.step - 1]
                self._log(build, "info", f"[{event.step}/{event.steps}] {event.instruction}", step)
            elif isinstance(event, StepOutput):
                self._log(build, "info", event.output, steps[event.step - 1])
            elif isinstance(event, BuildFailed):
                step = steps[event.step - 1]
                message = f"{event.instruction}: {event.error}"
                self._log(build, "error", message, step)
                self._fail(build, message, step)
            else:
                self._log(
                    build, "info", f"built {event.template.name} ({event.template.size} bytes)"
                )

        return emit

    def _end(self, build: E2BBuild, built: bool, context: IO[bytes] | None) -> Any:
        if context is not None:
            context.close()
        build.close_uploads()
        if not built:  # the builder has emitted its failure
            return None
        return Deferred.fromCoroutine(self._name_others(build))

    async def _name_others(self, build: E2BBuild) -> None:
        """The build's other names made (its tags), then it is ready."""
        for other in build.others:
            try:
                await self.copy(build.name, other)
            except SandboxdError as e:
                self._fail(build, f"the template's name {other!r}: {e}", BASE_STEP)
                return
            self._log(build, "info", f"named {other}")
        build.status = READY

    async def copy(self, source: str, name: str) -> None:
        """Template ``name`` made as a copy of template ``source`` (a build of ``FROM
        source`` alone; ``TemplateConflict`` when ``name`` is taken)."""
        running = start_build(self.store, name, f"FROM {source}\n", None, "none", _ignored)
        if await running.run() is None:  # pragma: no cover - only for want of space (cp -a)
            raise SandboxdError(f"the copy of {source!r} as {name!r} failed (see the daemon's log)")

    def _log(self, build: E2BBuild, level: str, message: str, step: str | None = None) -> None:
        if build.log_cut:
            return
        now = self.clock.seconds()
        if len(build.log) >= LOG_MAX or build.log_bytes + len(message) > LOG_BYTES_MAX:
            build.log_cut = True
            note = f"the log is cut here (at most {LOG_MAX} entries, {LOG_BYTES_MAX} bytes)"
            build.log.append(LogEntry(now, "warn", note))
            return
        build.log_bytes += len(message)
        build.log.append(LogEntry(now, level, message, step))

    def _fail(self, build: E2BBuild, message: str, step: str) -> None:
        build.status = ERROR
        build.reason = (message, step, tuple(build.log[-REASON_ENTRIES:]))
        log.info("e2b: template build {id} failed: {message}", id=build.id, message=message)
