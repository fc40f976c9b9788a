"""Archives made in the tests: root filesystem tarballs, OCI image layouts and ``docker save``
archives, built member by member with ``tarfile`` (hostile ones included)."""

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterable
from typing import Any

Entry = tuple[tarfile.TarInfo, bytes]


def file(name: str, data: bytes = b"", mode: int = 0o644) -> Entry:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
    return info, data


def directory(name: str, mode: int = 0o755) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info, b""


def link(name: str, target: str, hard: bool = False) -> Entry:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, b""


def special(name: str, kind: bytes) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.devmajor, info.devminor = kind, 0o666, 1, 3
    return info, b""


def tar(entries: Iterable[Entry], compression: str = "") -> bytes:
    """A tar of ``entries`` in order, compressed with ``gz`` or ``zst`` if asked."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = out.getvalue()
    if compression == "gz":
        return gzip.compress(raw)
    if compression == "zst":
        return subprocess.run(
            ["zstd", "-q", "-c"], input=raw, capture_output=True, check=True
        ).stdout
    return raw


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest(data), "size": len(data)}


def oci_archive(
    layers: list[bytes],
    config: dict[str, Any] | None = None,
    nested_index: bool = False,
    layer_digests: list[str] | None = None,
) -> bytes:
    """An OCI image layout in a tar: ``oci-layout``, ``index.json`` (and an index it points to
    when ``nested_index``), a manifest, a config and ``layers`` (their types from their
    magic). ``layer_digests`` overrides the digests the manifest gives the layers."""
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> bytes:
        blobs[digest(data)] = data
        return data

    config_blob = add(json.dumps(config or {"config": {}}).encode())
    layer_descriptors = []
    for number, layer in enumerate(layers):
        kind = "tar+gzip" if layer[:2] == b"\x1f\x8b" else "tar"
        described = descriptor(f"application/vnd.oci.image.layer.v1.{kind}", add(layer))
        if layer_digests is not None:
            described["digest"] = layer_digests[number]
        layer_descriptors.append(described)
    manifest = add(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": descriptor("application/vnd.oci.image.config.v1+json", config_blob),
                "layers": layer_descriptors,
            }
        ).encode()
    )
    top = {
        "schemaVersion": 2,
        "manifests": [descriptor("application/vnd.oci.image.manifest.v1+json", manifest)],
    }
    if nested_index:
        inner = add(
            json.dumps({**top, "mediaType": "application/vnd.oci.image.index.v1+json"}).encode()
        )
        top = {
            "schemaVersion": 2,
            "manifests": [descriptor("application/vnd.oci.image.index.v1+json", inner)],
        }
    entries = [
        file("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
        file("index.json", json.dumps(top).encode()),
        directory("blobs"),
        directory("blobs/sha256"),
    ]
    entries += [file("blobs/sha256/" + name[7:], data) for name, data in blobs.items()]
    return tar(entries)


def docker_archive(layers: list[bytes], config: dict[str, Any]) -> bytes:
    """An older ``docker save`` archive: ``manifest.json``, a config, ``<n>/layer.tar``."""
    config_data = json.dumps(config).encode()
    names = [f"{number}/layer.tar" for number in range(len(layers))]
    manifest = [{"Config": "config.json", "RepoTags": ["test:latest"], "Layers": names}]
    entries = [
        file("manifest.json", json.dumps(manifest).encode()),
        file("config.json", config_data),
    ]
    entries += [file(name, layer) for name, layer in zip(names, layers, strict=True)]
    return tar(entries)
