"""``FROM debian:<suite>``: a Debian root made by ``mmdebstrap`` (docs/extensions.rst,
"Building a template").

The suite's ``minbase`` root is made once into a tarball in the cache
(``SANDBOXD_DEBIAN_CACHE``, else ``{root}/.templates/.cache``), its download paid once; each
build then writes it into its own files as an import does
(:class:`~sandboxd.core.templates.extract.Extraction`). ``mmdebstrap`` runs as root (its
``root`` mode) with its temporary directory inside the build's own directory, in the build's
cgroup and a mount namespace of its own (``Build.execute_host``), from the mirror
``SANDBOXD_DEBIAN_MIRROR`` names (else ``mmdebstrap``'s default, ``deb.debian.org``).
"""

import os
import re
import secrets
import tarfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from sandboxd.core.templates.extract import Extraction
from sandboxd.errors import BadRequest

if TYPE_CHECKING:
    from sandboxd.core.templates.builder import Build

SUITE = re.compile(r"[a-z][a-z0-9-]{0,31}\Z")


def cache_directory(store_directory: str) -> str:
    return os.environ.get("SANDBOXD_DEBIAN_CACHE") or os.path.join(store_directory, ".cache")


def mirrors() -> list[str]:
    """``mmdebstrap``'s mirror argument: ``SANDBOXD_DEBIAN_MIRROR``'s, if set."""
    mirror = os.environ.get("SANDBOXD_DEBIAN_MIRROR")
    return [mirror] if mirror else []


def extract(
    tarball: str, rootfs: str, limit: int, keep_owners: bool, stopped: Callable[[], bool]
) -> int:
    """The suite's tarball written into the new directory ``rootfs``; its files' bytes
    (:class:`~sandboxd.core.templates.extract.Stopped` once ``stopped()`` says so)."""
    os.mkdir(rootfs, 0o755)
    root_fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        extraction = Extraction(root_fd, limit, keep_owners, stopped=stopped)
        with tarfile.open(tarball, "r:*") as tar:
            extraction.apply((member, tar) for member in tar)
        extraction.finish()
    finally:
        os.close(root_fd)
    return extraction.size


async def bootstrap(build: "Build", suite: str) -> None:
    """The build's files made from Debian ``suite`` (its cached tarball, made first if
    missing; ``mmdebstrap``'s output is the step's)."""
    if SUITE.match(suite) is None:
        raise BadRequest(f"debian:{suite}: not a Debian suite's name")
    cache = cache_directory(build.store.directory)
    tarball = os.path.join(cache, f"debian-{suite}.tar")
    build.base_digest = f"debian:{suite}"
    build.env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    if not os.path.exists(tarball):
        os.makedirs(cache, 0o700, exist_ok=True)
        partial = f"{tarball}.{secrets.token_hex(4)}.partial"
        scratch = os.path.join(build.directory, "tmp")
        os.mkdir(scratch, 0o700)
        try:
            await build.execute_host(
                [
                    *("mmdebstrap", "--mode=root", "--format=tar", "--variant=minbase"),
                    *(suite, partial, *mirrors()),
                ],
                {"TMPDIR": scratch},
            )
            os.rename(partial, tarball)  # pragma: no cover - a download: SANDBOXD_SLOW_TESTS=1
        finally:
            if os.path.lexists(partial):  # pragma: no branch - else a download (as above)
                os.unlink(partial)  # a download cut short
    await build.stoppable(
        extract, tarball, build.rootfs, build.store.limit, build.store.keep_owners
    )
