"""What an imported archive is, and the layers and image config it holds (docs/extensions.rst,
"Templates").

Three kinds of archive, told apart by their content, not by a name or a header:

- an OCI image layout in a tar (``oci-layout`` and ``index.json`` at its top: ``skopeo copy
  … oci-archive:``, ``docker save`` of Docker 25 and later, ``buildah push``);
- a ``docker save`` archive of older Docker (``manifest.json`` naming ``Config`` and
  ``Layers``);
- any other tar is a root filesystem (``tar -C rootfs -c .``).

The outer archive may be plain, gzip, bzip2 or xz (``tarfile``), or zstd (a root filesystem
only, through the ``zstd`` program); layers may be any of those. The layers are read straight
from the archive with ``tarfile`` (no skopeo or umoci: nothing to install, and every member
goes through :class:`~sandboxd.core.templates.extract.Extraction`, which never follows a link
on the host). Each blob's sha256 is checked against the digest that names it.
"""

import hashlib
import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, cast

from attrs import frozen

from sandboxd.errors import BadArchive

NOBODY = 65534
"""The uid and gid ``zstd`` runs as under a root daemon."""
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
INDEX_DEPTH = 3
"""Components of the deepest member an image layout names (``blobs/sha256/<hex>``)."""
JSON_MAX = 4 << 20
"""Largest index, manifest or config read (they are a few kilobytes)."""
DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
DAMAGED = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)
"""What reading a damaged (truncated, corrupted) tar raises, whatever its compression."""
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}

Layer = Callable[[], Any]
"""Opens one layer: a context manager yielding the members of its tar with the tar."""


@frozen
class ImageConfig:
    """What a template keeps of an image's config: its environment and working directory."""

    env: dict[str, str]
    workdir: str

    @classmethod
    def of(cls, config: Any) -> "ImageConfig":
        """From an OCI/Docker image config document (anything missing: empty)."""
        inner = config.get("config") if isinstance(config, dict) else None
        inner = inner if isinstance(inner, dict) else {}
        env: dict[str, str] = {}
        for item in inner.get("Env") or []:
            if isinstance(item, str) and "=" in item:
                key, value = item.split("=", 1)
                env[key] = value
        workdir = inner.get("WorkingDir")
        return cls(env, workdir if isinstance(workdir, str) and workdir else "/")


def hash_file(source: IO[bytes]) -> str:
    """``sha256:<hex>`` of everything in ``source`` (left at its start)."""
    source.seek(0)
    digest = hashlib.sha256()
    while chunk := source.read(1 << 20):
        digest.update(chunk)
    source.seek(0)
    return "sha256:" + digest.hexdigest()


def _zstd(source: IO[bytes], scratch: str) -> subprocess.Popen[bytes]:
    """``zstd -dc`` of ``source`` (copied into ``scratch`` first), reading from its stdout.

    A daemon running as root runs it as ``nobody``: it parses bytes from the network, and
    needs nothing but the descriptors it is given (its input open, its output a pipe)."""
    with open(scratch, "wb") as copy:
        shutil.copyfileobj(source, copy, 1 << 20)
    unprivileged: dict[str, Any] = (
        {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
    )
    with open(scratch, "rb") as compressed:
        return subprocess.Popen(
            ["zstd", "-dcq"],
            stdin=compressed,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            **unprivileged,
        )


def open_tar(source: Any, in_order: bool, what: str) -> tarfile.TarFile:
    """``tarfile.open`` of ``source`` read ``in_order`` (a stream) or not, any compression
    ``tarfile`` reads; ``BadArchive`` naming ``what`` when it is no tar."""
    try:
        if in_order:
            return tarfile.open(fileobj=source, mode="r|*")
        return tarfile.open(fileobj=source, mode="r:*")
    except DAMAGED as e:
        raise BadArchive(f"{what}: not a tar archive ({e})") from None


@contextmanager
def stream(source: IO[bytes], scratch: str, what: str) -> Iterator[tarfile.TarFile]:
    """The tar in ``source`` read in order, whatever its compression (``what`` names it in
    errors; ``scratch`` is a file name a zstd one may be copied to)."""
    head = source.read(4)
    source.seek(0)
    process = _zstd(source, scratch) if head == ZSTD_MAGIC else None
    try:
        with open_tar(process.stdout if process else source, True, what) as tar:
            yield tar
    finally:
        if process is not None:
            process.kill()
            process.wait()


def forget_members(tar: tarfile.TarFile) -> None:
    """Drop the record ``tarfile`` keeps of every member it has read (millions, for a root
    filesystem); reading on is unaffected (its iterator asks for the next member)."""
    cast(Any, tar).members.clear()


def members(tar: tarfile.TarFile, what: str) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    """Each member of a tar read in order, with the tar; a damaged one is ``BadArchive``."""
    try:
        for member in tar:
            yield member, tar
            forget_members(tar)
    except DAMAGED as e:
        raise BadArchive(f"{what}: a damaged tar ({e})") from None


class _Hashing:
    """A reader that hashes what goes through it (a layer blob, checked once read whole)."""

    def __init__(self, source: IO[bytes]) -> None:
        self.source, self.digest = source, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.digest.update(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        """Back to the start (after a peek at the magic): hashing starts again."""
        self.digest = hashlib.sha256()
        return self.source.seek(offset, whence)

    def finish(self) -> str:
        while self.read(1 << 20):
            pass
        return "sha256:" + self.digest.hexdigest()


@frozen
class Image:
    """An archive read as an image: its layers, bottom first, and its config."""

    layers: list[Layer]
    config: ImageConfig


def _normal(name: str) -> str:
    return "/".join(part for part in name.split("/") if part not in ("", "."))


class Archive:
    """An outer archive opened for random access (OCI layout and docker save alike)."""

    def __init__(self, tar: tarfile.TarFile, scratch: str) -> None:
        """Index the regular members of at most :data:`INDEX_DEPTH` components, the only
        ones an image layout names (``index.json``, ``blobs/sha256/…``, ``…/layer.tar``): a
        root filesystem's deep tree is read once and forgotten."""
        self.tar, self.scratch = tar, scratch
        self.index: dict[str, tarfile.TarInfo] = {}
        for member in tar:
            name = _normal(member.name)
            if member.isreg() and name.count("/") < INDEX_DEPTH:
                self.index[name] = member
            forget_members(tar)

    def file(self, name: str) -> IO[bytes]:
        member = self.index.get(name)
        source = self.tar.extractfile(member) if member is not None else None
        if source is None:
            raise BadArchive(f"member {name!r}: missing from the archive")
        return source

    def json(self, name: str, digest: str | None = None) -> Any:
        member = self.index.get(name)
        if member is not None and member.size > JSON_MAX:
            raise BadArchive(f"member {name!r}: larger than {JSON_MAX} bytes")
        data = self.file(name).read()
        if digest is not None and "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise BadArchive(f"member {name!r}: its content does not match its digest")
        try:
            return json.loads(data)
        except ValueError:
            raise BadArchive(f"member {name!r}: not JSON") from None

    def layer(self, name: str, digest: str | None) -> Layer:
        @contextmanager
        def opened() -> Iterator[Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]]:
            hashing = _Hashing(self.file(name))
            with stream(hashing, self.scratch, f"layer {name!r}") as tar:  # type: ignore[arg-type]
                yield members(tar, f"layer {name!r}")
            if digest is not None and hashing.finish() != digest:
                raise BadArchive(f"member {name!r}: its content does not match its digest")

        return opened


def blob(descriptor: Any, where: str) -> tuple[str, str]:
    """The member name and digest of an OCI descriptor (``BadArchive`` when malformed)."""
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise BadArchive(f"member {where!r}: a descriptor without a sha256 digest")
    return "blobs/sha256/" + digest[len("sha256:") :], digest


def _pick(manifests: Any, where: str) -> Any:
    """The one manifest of an index for this host's platform (or the only one)."""
    if not isinstance(manifests, list) or not manifests:
        raise BadArchive(f"member {where!r}: lists no image")
    if len(manifests) == 1:
        return manifests[0]
    arch = ARCHITECTURES.get(platform.machine(), platform.machine())
    for manifest in manifests:
        wanted = manifest.get("platform") if isinstance(manifest, dict) else None
        if isinstance(wanted, dict) and wanted.get("architecture") == arch:
            return manifest
    raise BadArchive(f"member {where!r}: lists {len(manifests)} images, none for {arch}")


def _object(document: Any, where: str) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise BadArchive(f"member {where!r}: not a JSON object")
    return document


def oci_image(archive: Archive) -> Image:
    """The image of an OCI layout: ``index.json`` → (an index →) a manifest → config, layers."""
    where = "index.json"
    document = _object(archive.json(where), where)
    for _ in range(4):  # an index of indexes, a few levels at most
        if document.get("mediaType") not in INDEX_TYPES and "manifests" not in document:
            break
        where, digest = blob(_pick(document.get("manifests"), where), where)
        document = _object(archive.json(where, digest), where)
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise BadArchive(f"member {where!r}: a manifest without layers")
    config_name, config_digest = blob(document.get("config"), where)
    config = ImageConfig.of(archive.json(config_name, config_digest))
    return Image([archive.layer(*blob(layer, where)) for layer in layers], config)


def docker_image(archive: Archive) -> Image:
    """The image of an older ``docker save`` archive: ``manifest.json`` → config, layers."""
    manifest = archive.json("manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        raise BadArchive("member 'manifest.json': must list exactly one image")
    layers, config = manifest[0].get("Layers"), manifest[0].get("Config")
    if not isinstance(layers, list) or not isinstance(config, str):
        raise BadArchive("member 'manifest.json': an image without Config or Layers")
    if not all(isinstance(layer, str) for layer in layers):
        raise BadArchive("member 'manifest.json': a layer that is not a member name")
    image_config = ImageConfig.of(archive.json(_normal(config)))
    return Image([archive.layer(_normal(layer), None) for layer in layers], image_config)


def rootfs_image(source: IO[bytes], scratch: str) -> Image:
    """A root filesystem tarball: one layer, no config."""

    @contextmanager
    def opened() -> Iterator[Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]]:
        with stream(source, scratch, "the archive") as tar:
            yield members(tar, "the archive")

    return Image([opened], ImageConfig({}, "/"))


@contextmanager
def read_image(source: IO[bytes], scratch: str) -> Iterator[Image]:
    """The image in the archive ``source`` (seekable, at its start), whatever its kind."""
    if source.read(4) == ZSTD_MAGIC:
        source.seek(0)
        yield rootfs_image(source, scratch)
        return
    source.seek(0)
    with open_tar(source, False, "the archive") as tar:
        try:
            archive = Archive(tar, scratch)
        except DAMAGED as e:
            raise BadArchive(f"the archive: a damaged tar ({e})") from None
        if "oci-layout" in archive.index and "index.json" in archive.index:
            yield oci_image(archive)
        elif "manifest.json" in archive.index:
            yield docker_image(archive)
        else:
            source.seek(0)
            yield rootfs_image(source, scratch)
