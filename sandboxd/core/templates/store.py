"""The template store: named, read-only root filesystems under the state root
(docs/extensions.rst, "Templates").

``{root}/.templates/`` (root's alone, 0700: no sandbox uid reaches a template's files on the
host; made by the first import) holds one directory per template, ``{name}/``, with its tree
in ``rootfs/`` and its record in ``template.json``. An import writes into
``.import-{random}/`` and a build (:mod:`~sandboxd.core.templates.builder`) into
``.build-{random}/``, renamed into place once complete; a delete renames the template to
``.delete-{random}/`` before removing it. A daemon killed in the middle leaves only such
dot-directories, which :meth:`open` removes at start-up: a template is either whole or absent.
"""

import json
import os
import re
import secrets
from collections.abc import Callable
from typing import IO, Any

from attrs import define, field, frozen
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from sandboxd.core.files.tree import remove_tree
from sandboxd.core.templates.build_limits import BuildLimits
from sandboxd.core.templates.extract import Extraction
from sandboxd.core.templates.sources import hash_file, read_image
from sandboxd.errors import BadRequest, TemplateConflict, TemplateNotFound

log = Logger()

NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?\Z")
"""A template's name: ``name[:tag]``, lowercase like an image repository's, its tag like an
image tag's. Never ``.``-led, so never one of the store's own dot-directories."""
DIRECTORY = ".templates"
"""The store's directory under the state root (a dot-name: never a sandbox id)."""
RECORD = "template.json"
ROOTFS = "rootfs"
IMPORTING, DELETING, BUILDING = ".import-", ".delete-", ".build-"


def check_name(name: str) -> str:
    """``name`` itself when it can name a template, else ``BadRequest``."""
    if NAME.match(name) is None:
        raise BadRequest(
            f"{name!r} is not a template name (lowercase letters, digits, '.', '_', '-', "
            "then optionally ':' and a tag)"
        )
    return name


@frozen
class Template:
    """One template's record."""

    name: str
    digest: str
    """``sha256:<hex>`` of the archive it was imported from."""
    size: int
    """Bytes of its files (hard links counted once)."""
    env: dict[str, str]
    """The image's environment (empty for a root filesystem tarball)."""
    workdir: str
    created: float
    """When its import started (seconds since the epoch, from the daemon's clock)."""

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "digest": self.digest,
            "size": self.size,
            "env": self.env,
            "workdir": self.workdir,
            "created": self.created,
        }


@frozen
class TemplateRoot:
    """What a sandbox made from a template takes of it: its name (counted in
    :attr:`TemplateStore.users`), the directory of its files, its env and workdir."""

    name: str
    rootfs: str
    env: dict[str, str]
    workdir: str


def import_archive(directory: str, source: IO[bytes], limit: int, keep_owners: bool) -> Any:
    """Write the template of archive ``source`` into the new directory ``directory``
    (blocking: run in a thread). Returns its digest, size, env and workdir."""
    digest = hash_file(source)
    os.mkdir(directory, 0o700)
    os.mkdir(os.path.join(directory, ROOTFS), 0o755)
    root_fd = os.open(os.path.join(directory, ROOTFS), os.O_RDONLY | os.O_DIRECTORY)
    scratch = os.path.join(directory, "scratch")
    try:
        extraction = Extraction(root_fd, limit, keep_owners)
        with read_image(source, scratch) as image:
            for layer in image.layers:
                with layer() as members:
                    extraction.apply(members)
        extraction.finish()
    finally:
        os.close(root_fd)
        if os.path.exists(scratch):
            os.unlink(scratch)
    return digest, extraction.size, image.config.env, image.config.workdir


@define
class TemplateStore:
    """The templates of one state root; imports and removals run in ``pool``."""

    directory: str
    limit: int
    """``SANDBOXD_TEMPLATE_MAX``: most bytes of one template's files."""
    keep_owners: bool
    """Whether files keep the archive's owners (the daemon runs as root)."""
    reactor: Any
    pool: Any
    users: Callable[[str], int] = lambda name: 0
    """How many sandboxes use a template (a template in use cannot be deleted)."""
    build_limits: BuildLimits = field(factory=BuildLimits)
    """What a build's commands may take of the host, and its longest run (the daemon's are
    set at start-up, :mod:`~sandboxd.core.templates.build_limits`)."""
    templates: dict[str, Template] = field(factory=dict)
    _busy: set[str] = field(factory=set)
    """Names being imported now."""

    @classmethod
    def open(
        cls, state_root: str, limit: int, keep_owners: bool, reactor: Any, pool: Any
    ) -> "TemplateStore":
        """The store under ``state_root``, what an import or delete cut short left removed,
        and every template's record read. Its directory is made by the first import (a start
        that fails leaves nothing of it behind); ``OSError`` when the root cannot hold it."""
        directory = os.path.join(state_root, DIRECTORY)
        store = cls(directory, limit, keep_owners, reactor, pool)
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            if not os.path.isdir(state_root):
                raise
            return store
        os.chmod(directory, 0o700)
        for name in names:
            path = os.path.join(directory, name)
            if name.startswith((IMPORTING, DELETING, BUILDING)):
                log.info("templates: removing {path}, left by a stopped daemon", path=path)
                remove_tree(path)
            elif NAME.match(name):
                try:
                    with open(os.path.join(path, RECORD), encoding="utf-8") as record:
                        store.templates[name] = Template(**json.load(record))
                except (OSError, ValueError, TypeError) as e:
                    log.warn("templates: {path} passed over: {error}", path=path, error=e)
        return store

    def listing(self) -> list[Template]:
        return [self.templates[name] for name in sorted(self.templates)]

    def get(self, name: str) -> Template:
        template = self.templates.get(name)
        if template is None:
            raise TemplateNotFound(f"no template named {name!r}")
        return template

    def rootfs(self, template: Template) -> str:
        """The directory of ``template``'s files."""
        return os.path.join(self.directory, template.name, ROOTFS)

    def root(self, name: str) -> TemplateRoot:
        """What a sandbox made from template ``name`` takes of it (``TemplateNotFound``)."""
        template = self.get(name)
        return TemplateRoot(name, self.rootfs(template), dict(template.env), template.workdir)

    def put(self, name: str, source: IO[bytes]) -> Deferred[Template]:
        """Import archive ``source`` (closed once read) as template ``name``
        (``TemplateConflict`` if taken).

        The import goes on when its caller stops waiting (the answer cancelled: an HTTP client
        gone): cancelling it midway would remove the directory its thread is still writing.
        It ends whole or absent all the same, and a failure no one waits for is logged."""
        work = Deferred.fromCoroutine(self._put(name, source))
        answer: Deferred[Template] = Deferred()

        def forward(result: Template | Failure) -> None:
            if not answer.called:
                if isinstance(result, Failure):
                    answer.errback(result)
                else:
                    answer.callback(result)
            elif isinstance(result, Failure):
                log.failure("templates: import of {name} failed", result, name=name)

        work.addBoth(forward)
        return answer

    async def _put(self, name: str, source: IO[bytes]) -> Template:
        try:
            return await self._import(name, source)
        finally:
            source.close()

    async def _import(self, name: str, source: IO[bytes]) -> Template:
        self.reserve(name)
        created = self.reactor.seconds()
        temporary = self._temporary(IMPORTING)
        try:
            digest, size, env, workdir = await deferToThreadPool(
                self.reactor,
                self.pool,
                import_archive,
                temporary,
                source,
                self.limit,
                self.keep_owners,
            )
            template = Template(name, digest, size, env, workdir, created)
            await self._run(self._complete, temporary, template)
        except BaseException:
            await self._run(remove_tree, temporary)
            raise
        finally:
            self._busy.discard(name)
        self.templates[name] = template
        log.info("templates: {name} imported ({digest}, {size} bytes)", **template.record())
        return template

    def reserve(self, name: str) -> None:
        """Hold ``name`` for an import or build (``TemplateConflict`` if taken or held); the
        import, :meth:`complete` or :meth:`abandon` lets it go."""
        check_name(name)
        if name in self.templates or name in self._busy:
            raise TemplateConflict(f"template {name!r} exists (delete it first)")
        self._busy.add(name)

    def _temporary(self, prefix: str) -> str:
        """A new directory's path in the store (made when missing, root's alone)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)  # whatever the umask: root's alone
        return os.path.join(self.directory, prefix + secrets.token_hex(8))

    def begin(self, name: str) -> str:
        """The new directory (root's, 0700) a build of ``name`` (reserved) writes into."""
        directory = self._temporary(BUILDING)
        os.mkdir(directory, 0o700)
        return directory

    async def complete(self, directory: str, template: Template) -> None:
        """A build's ``directory`` (its files in ``rootfs/``) in place as ``template``."""
        try:
            await self._run(self._complete, directory, template)
        finally:
            self._busy.discard(template.name)
        self.templates[template.name] = template
        log.info("templates: {name} built ({digest}, {size} bytes)", **template.record())

    async def abandon(self, directory: str, name: str) -> None:
        """A failed build's ``directory`` (``""``: none was made) removed, its name let go."""
        try:
            if directory:
                await self._run(remove_tree, directory)
        finally:
            self._busy.discard(name)

    def in_thread(self, work: Callable[..., Any], *args: Any) -> Deferred[Any]:
        """``work(*args)`` in the store's pool."""
        return self._run(work, *args)

    def _complete(self, temporary: str, template: Template) -> None:
        record = os.path.join(temporary, RECORD)
        with open(record, "w", encoding="utf-8") as file:
            json.dump(template.record(), file)
            file.flush()
            os.fsync(file.fileno())
        os.rename(temporary, os.path.join(self.directory, template.name))

    def _run(self, work: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return deferToThreadPool(self.reactor, self.pool, work, *args)

    async def delete(self, name: str) -> None:
        """Remove template ``name`` (``TemplateConflict`` while sandboxes use it)."""
        self.get(name)
        users = self.users(name)
        if users:
            raise TemplateConflict(f"template {name!r} is used by {users} sandboxes")
        del self.templates[name]
        doomed = os.path.join(self.directory, DELETING + secrets.token_hex(8))
        os.rename(os.path.join(self.directory, name), doomed)
        await self._run(remove_tree, doomed)
