"""The blocking file work of a template build (run in a thread; docs/extensions.rst, "Building
a template"): the base's files copied in, ``COPY`` from the context, the result measured."""

import hashlib
import os
import posixpath
import stat
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from typing import IO

from sandboxd.core.templates.extract import Extraction, Stopped, member_parts, never
from sandboxd.core.templates.sources import hash_file
from sandboxd.errors import BadArchive, BadRequest

DOCKERFILE = "Dockerfile"
"""The member of a context tar that holds the build's Dockerfile."""
DOCKERFILE_MAX = 1 << 20
STOP_POLL = 0.05
"""How often, in seconds, a copy made by ``cp`` asks whether to stop."""


def copy_base(source: str, target: str, stopped: Callable[[], bool] = never) -> None:
    """``source``'s tree (a template's files) as ``target`` (new): owners, modes, links and
    hard links kept, shared with the source where the filesystem can (``--reflink=auto``).
    ``cp`` is killed, and :class:`~sandboxd.core.templates.extract.Stopped` raised, once
    ``stopped()`` (asked every :data:`STOP_POLL` seconds) says so; ``CalledProcessError``
    when it fails."""
    argv = ["cp", "-a", "--reflink=auto", "--no-target-directory", source, target]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
        while True:
            try:
                _, errors = process.communicate(timeout=STOP_POLL)
                break
            except subprocess.TimeoutExpired:
                if stopped():
                    process.kill()
                    process.communicate()
                    raise Stopped() from None
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, argv, stderr=errors)


def read_dockerfile(context: IO[bytes]) -> str:
    """The ``Dockerfile`` at the top of the context tar (``BadRequest`` without one)."""
    context.seek(0)
    try:
        with tarfile.open(fileobj=context, mode="r:*") as tar:
            for member in tar:
                if member_parts(member) == (DOCKERFILE,) and member.isreg():
                    if member.size > DOCKERFILE_MAX:
                        raise BadRequest("the context's Dockerfile is over 1 MiB")
                    file = tar.extractfile(member)
                    assert file is not None  # a regular member always has a file
                    return file.read().decode("utf-8", "replace")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise BadRequest(f"the build's body is not a tar of its context: {e}") from None
    raise BadRequest("the build's context has no Dockerfile at its top")


def context_digest(dockerfile: str, context: IO[bytes] | None, base: str) -> str:
    """A build's digest: ``sha256`` of its base's digest, its Dockerfile and its context."""
    digest = hashlib.sha256(base.encode() + b"\n" + dockerfile.encode() + b"\n")
    if context is not None:
        digest.update(hash_file(context).encode())
    return "sha256:" + digest.hexdigest()


def destination(workdir: str, dest: str) -> str:
    """``COPY``'s destination as a path from the root (relative: from the workdir)."""
    return posixpath.normpath(posixpath.join(workdir, dest)).lstrip("/")


def copy_members(
    tar: tarfile.TarFile, sources: list[str], dest: str, workdir: str
) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    """The context's members ``sources`` name, renamed to where ``COPY`` puts them: a
    directory's content into ``dest``; a file at ``dest``, or in it when ``dest`` ends with
    ``/`` or several sources are given. ``BadArchive`` for a source no member matches."""
    into = dest.endswith("/") or len(sources) > 1
    target = destination(workdir, dest)
    members = tar.getmembers()
    for source in sources:
        parts = member_parts(tarfile.TarInfo(source))
        found = False
        for member in members:
            name = member_parts(member)
            if name[: len(parts)] != parts:
                continue
            found = True
            rest = name[len(parts) :]
            if not rest and not member.isdir():
                rest = (parts[-1],) if into else ()
            renamed = _renamed(member, "/".join((target, *rest)).strip("/"))
            if member.islnk():
                link = member_parts(tarfile.TarInfo(member.linkname))
                if link[: len(parts)] == parts:
                    renamed.linkname = "/".join((target, *link[len(parts) :]))
            yield renamed, tar
        if not found:
            raise BadArchive(f"COPY {source}: no such file in the context")


def _renamed(member: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    renamed = tarfile.TarInfo(name or ".")
    for attribute in ("size", "mtime", "mode", "type", "linkname", "uid", "gid"):
        setattr(renamed, attribute, getattr(member, attribute))
    renamed.offset_data = member.offset_data
    renamed.sparse = member.sparse
    return renamed


def copy_context(
    rootfs: str,
    context: IO[bytes],
    sources: list[str],
    dest: str,
    workdir: str,
    limit: int,
    stopped: Callable[[], bool] = never,
) -> int:
    """``COPY sources dest`` from the context tar into ``rootfs``, with an import's checks
    (:class:`~sandboxd.core.templates.extract.Extraction`: no ``..``, no device), except that
    a path goes through the tree's links as they resolve inside it (Debian's ``/bin`` →
    ``usr/bin``; :mod:`~sandboxd.core.templates.in_root`): files are root's. Returns the
    bytes written; :class:`~sandboxd.core.templates.extract.Stopped` once ``stopped()``
    says so (asked before each file and each MiB)."""
    context.seek(0)
    root_fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        extraction = Extraction(
            root_fd, limit, keep_owners=False, links_in_root=True, stopped=stopped
        )
        with tarfile.open(fileobj=context, mode="r:*") as tar:
            extraction.apply(copy_members(tar, sources, dest, workdir))
        extraction.finish()
    finally:
        os.close(root_fd)
    return extraction.size


def tree_size(path: str) -> int:
    """Bytes of the regular files under ``path`` (hard links once, links never followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total
