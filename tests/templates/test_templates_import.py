"""Imports of archives made here into a template's directory (``import_archive``): root
filesystem tarballs in every compression, OCI layouts with layers and whiteouts, ``docker
save`` archives, and what each kind of damaged archive is refused with."""

import errno
import io
import json
import os
import platform
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sandboxd.core.templates import sources
from sandboxd.core.templates.sources import ImageConfig
from sandboxd.core.templates.store import ROOTFS, import_archive
from sandboxd.errors import BadArchive, InsufficientStorage, TemplateTooLarge
from tests.templates.archives import (
    digest,
    directory,
    docker_archive,
    file,
    link,
    oci_archive,
    special,
    tar,
)

LIMIT = 1 << 20
AS_ROOT = os.geteuid() == 0


def imported(tmp_path: Path, archive: bytes, limit: int = LIMIT) -> tuple[Path, tuple]:
    target = tmp_path / "template"
    tmp_path.mkdir(parents=True, exist_ok=True)
    result = import_archive(str(target), io.BytesIO(archive), limit, AS_ROOT)
    return target / ROOTFS, result


ROOTFS_ENTRIES = [
    directory("./"),
    directory("./etc"),
    file("./etc/os-release", b"ID=test\n"),
    directory("./usr/bin", 0o755),
    file("./usr/bin/tool", b"#!/bin/sh\n", 0o4755),
    link("./bin", "usr/bin"),
    link("./usr/bin/same", "usr/bin/tool", hard=True),
    link("./etc/absolute", "/etc/os-release"),
    directory("./readonly", 0o555),
    file("./readonly/inside", b"x", 0o444),
]


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_a_rootfs_tarball_is_written_whole(tmp_path: Path, compression: str) -> None:
    archive = tar(ROOTFS_ENTRIES, compression)
    root, (found_digest, size, env, workdir) = imported(tmp_path, archive)
    assert found_digest == digest(archive)
    assert size == len(b"ID=test\n") + len(b"#!/bin/sh\n") + 1
    assert (env, workdir) == ({}, "/")
    assert (root / "etc/os-release").read_bytes() == b"ID=test\n"
    # setuid kept (a template is only ever mounted nosuid), hard link shares the inode
    assert stat.S_IMODE((root / "usr/bin/tool").stat().st_mode) == 0o4755
    assert (root / "usr/bin/same").stat().st_ino == (root / "usr/bin/tool").stat().st_ino
    assert os.readlink(root / "bin") == "usr/bin"
    assert os.readlink(root / "etc/absolute") == "/etc/os-release"  # kept, never followed
    assert stat.S_IMODE((root / "readonly").stat().st_mode) == 0o555
    assert (root / "readonly/inside").read_bytes() == b"x"
    assert sorted(os.listdir(root.parent)) == [ROOTFS]  # no scratch left


def test_device_nodes_are_skipped_and_fifos_made(tmp_path: Path) -> None:
    archive = tar(
        [
            special("dev-null", tarfile.CHRTYPE),
            special("disk", tarfile.BLKTYPE),
            special("pipe", tarfile.FIFOTYPE),
            file("kept", b"k"),
        ]
    )
    root, _ = imported(tmp_path, archive)
    assert sorted(os.listdir(root)) == ["kept", "pipe"]
    assert stat.S_ISFIFO((root / "pipe").lstat().st_mode)


def test_a_path_with_dot_dot_is_refused_and_nothing_lands_outside(tmp_path: Path) -> None:
    archive = tar([file("ok", b"1"), file("a/../../escaped", b"evil")])
    with pytest.raises(BadArchive, match=r"member 'a/../../escaped': its path holds '\.\.'"):
        imported(tmp_path, archive)
    assert not (tmp_path / "escaped").exists()
    assert not (tmp_path / "template/escaped").exists()


def test_an_absolute_path_is_made_relative_to_the_template(tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    root, _ = imported(tmp_path, tar([file(str(outside / "planted"), b"evil")]))
    assert not (outside / "planted").exists()
    assert (root / str(outside).lstrip("/") / "planted").read_bytes() == b"evil"


def test_a_member_through_a_symlink_pointing_out_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    archive = tar([link("escape", str(outside)), file("escape/planted", b"evil")])
    with pytest.raises(BadArchive, match="member 'escape/planted': its path goes through a link"):
        imported(tmp_path, archive)
    assert os.listdir(outside) == []


def test_a_relative_symlink_out_is_never_followed(tmp_path: Path) -> None:
    (tmp_path / "victim").write_bytes(b"host's")
    archive = tar([link("up", "../../victim"), file("up", b"replaced")])
    root, _ = imported(tmp_path, archive)
    assert (tmp_path / "victim").read_bytes() == b"host's"
    assert (root / "up").read_bytes() == b"replaced"
    assert not (root / "up").is_symlink()


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside", "elsewhere"])
def test_a_hard_link_to_a_file_not_in_the_layer_is_refused(tmp_path: Path, target: str) -> None:
    archive = tar([file("elsewhere-not", b"x"), link("stolen", target, hard=True)])
    with pytest.raises(BadArchive, match="member 'stolen': a hard link to a file outside"):
        imported(tmp_path, archive)


def test_a_hard_link_to_a_directory_or_link_is_refused(tmp_path: Path) -> None:
    archive = tar([directory("d"), link("linked", "d", hard=True)])
    with pytest.raises(BadArchive, match="member 'linked': a hard link to something other"):
        imported(tmp_path, archive)


def test_an_archive_past_the_limit_is_refused_before_the_member_is_written(tmp_path: Path) -> None:
    archive = tar([file("small", b"s"), file("big", b"b" * 4096)])
    with pytest.raises(TemplateTooLarge, match="member 'big': the template passes 4000 bytes"):
        imported(tmp_path, archive, limit=4000)
    assert not (tmp_path / "template" / ROOTFS / "big").exists()


def test_millions_of_empty_members_count_too(tmp_path: Path) -> None:
    archive = tar([file(f"f{n}") for n in range(20)])
    with pytest.raises(TemplateTooLarge, match="member 'f7'"):
        imported(tmp_path, archive, limit=4000)


@pytest.mark.parametrize("data", [b"", b"not a tar at all, not even close" * 40])
def test_what_is_not_a_tar_is_refused(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(BadArchive, match="the archive"):
        imported(tmp_path, data)


def test_a_truncated_tar_is_refused(tmp_path: Path) -> None:
    archive = tar([file("a", b"a" * 5000), file("b", b"b" * 5000)], "gz")
    with pytest.raises(BadArchive, match="the archive"):
        imported(tmp_path, archive[: len(archive) // 2])


LOWER = tar(
    [
        directory("etc"),
        file("etc/keep", b"kept"),
        file("etc/gone", b"whited out"),
        directory("opaque"),
        file("opaque/old", b"hidden by the opaque whiteout"),
        directory("dir-gone"),
        file("dir-gone/inside", b"x"),
    ]
)
UPPER = tar(
    [
        file("etc/.wh.gone"),
        file("opaque/new", b"this layer's"),
        file("opaque/.wh..wh..opq"),
        file(".wh.dir-gone"),
        file("etc/keep", b"replaced by the upper layer"),
        file(".wh.never-was"),
        file("nowhere/.wh.never-was"),
        directory("etc", 0o750),
    ],
    "gz",
)
CONFIG = {"config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "junk"], "WorkingDir": "/app"}}


def check_layers_applied(root: Path) -> None:
    assert sorted(os.listdir(root)) == ["etc", "opaque"]  # a whiteout makes no directory
    assert sorted(os.listdir(root / "etc")) == ["keep"]
    assert stat.S_IMODE((root / "etc").stat().st_mode) == 0o750  # the upper layer's mode
    assert (root / "etc/keep").read_bytes() == b"replaced by the upper layer"
    assert sorted(os.listdir(root / "opaque")) == ["new"]


@pytest.mark.parametrize("nested", [False, True])
def test_an_oci_layout_gives_its_layers_in_order_with_whiteouts(
    tmp_path: Path, nested: bool
) -> None:
    archive = oci_archive([LOWER, UPPER], CONFIG, nested_index=nested)
    root, (found_digest, _, env, workdir) = imported(tmp_path, archive)
    check_layers_applied(root)
    assert found_digest == digest(archive)
    assert env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    assert workdir == "/app"


def test_a_docker_save_archive_gives_its_layers_and_config(tmp_path: Path) -> None:
    root, (_, _, env, workdir) = imported(tmp_path, docker_archive([LOWER, UPPER], CONFIG))
    check_layers_applied(root)
    assert (env, workdir) == ({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "/app")


def test_a_hard_link_across_layers_is_refused(tmp_path: Path) -> None:
    upper = tar([link("stolen", "etc/keep", hard=True)])
    with pytest.raises(BadArchive, match="member 'stolen': a hard link to a file outside"):
        imported(tmp_path, oci_archive([LOWER, upper]))


def test_a_layer_whose_content_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    archive = oci_archive([LOWER], layer_digests=[digest(UPPER)])
    # the blob is looked up by the digest the manifest gives: absent
    with pytest.raises(BadArchive, match="missing from the archive"):
        imported(tmp_path, archive)


def test_a_tampered_blob_is_refused(tmp_path: Path) -> None:
    archive = oci_archive([LOWER])
    name = "blobs/sha256/" + digest(LOWER)[7:]
    with tarfile.open(fileobj=io.BytesIO(archive)) as source:
        entries = []
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isreg() else b""  # type: ignore[union-attr]
            if member.name == name:
                data = tar([file("etc/other", b"not the layer the digest names")])
                member.size = len(data)
            entries.append((member, data))
    with pytest.raises(BadArchive, match=f"member '{name}': its content does not match"):
        imported(tmp_path, tar(entries))


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (b"[]", "index.json"),
        (b"{not json", "not JSON"),
        (b'{"manifests": []}', "lists no image"),
        (b'{"manifests": [{"digest": "md5:abc"}]}', "without a sha256 digest"),
    ],
)
def test_a_broken_index_is_refused(tmp_path: Path, index: bytes, expected: str) -> None:
    archive = tar([file("oci-layout", b"{}"), file("index.json", index)])
    with pytest.raises(BadArchive, match=expected):
        imported(tmp_path, archive)


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (b"[]", "exactly one image"),
        (b'[{"Config": 1}]', "without Config or Layers"),
        (b'[{"Config": "c", "Layers": [1]}]', "not a member name"),
        (b'[{"Config": "c", "Layers": []}]', "'c': missing"),
    ],
)
def test_a_broken_docker_manifest_is_refused(
    tmp_path: Path, manifest: bytes, expected: str
) -> None:
    with pytest.raises(BadArchive, match=expected):
        imported(tmp_path, tar([file("manifest.json", manifest)]))


def test_an_image_config_without_env_or_workdir_is_empty() -> None:
    assert ImageConfig.of({"config": None}) == ImageConfig({}, "/")
    assert ImageConfig.of([]) == ImageConfig({}, "/")
    assert ImageConfig.of({"config": {"Env": None, "WorkingDir": ""}}) == ImageConfig({}, "/")


def replaced(archive: bytes, name: str, data: bytes) -> bytes:
    """``archive`` with the content of member ``name`` replaced by ``data``."""
    entries = []
    with tarfile.open(fileobj=io.BytesIO(archive)) as source:
        for member in source.getmembers():
            content = source.extractfile(member) if member.isreg() else None
            body = content.read() if content is not None else b""
            if member.name == name:
                body, member.size = data, len(data)
            entries.append((member, body))
    return tar(entries)


def oci_blob(data: bytes) -> str:
    return "blobs/sha256/" + digest(data)[7:]


def test_a_tampered_config_is_refused(tmp_path: Path) -> None:
    archive = oci_archive([LOWER], CONFIG)
    config = json.dumps(CONFIG).encode()
    tampered = replaced(
        archive, oci_blob(config), json.dumps({"config": {"Env": ["X=1"]}}).encode()
    )
    with pytest.raises(BadArchive, match=f"member '{oci_blob(config)}': its content does not"):
        imported(tmp_path, tampered)


def test_an_oversized_index_is_refused_unread(tmp_path: Path) -> None:
    archive = tar([file("oci-layout", b"{}"), file("index.json", b" " * (4 << 20) + b"{}")])
    with pytest.raises(BadArchive, match=r"member 'index\.json': larger than"):
        imported(tmp_path, archive)


def test_trailing_bytes_after_a_layer_are_hashed_too(tmp_path: Path) -> None:
    root, _ = imported(tmp_path, oci_archive([LOWER + b"\0" * (3 << 20)]))
    assert (root / "etc/keep").read_bytes() == b"kept"


def index_of(manifests: list[dict[str, Any]], blobs: dict[str, bytes]) -> bytes:
    """An OCI layout whose index lists ``manifests`` and holds ``blobs``."""
    entries = [
        file("oci-layout", b"{}"),
        file("index.json", json.dumps({"manifests": manifests}).encode()),
    ]
    entries += [file(oci_blob(data), data) for data in blobs.values()]
    return tar(entries)


def manifest_for(layer_file: str) -> tuple[dict[str, bytes], bytes]:
    """The blobs of an image whose one layer holds ``layer_file``, and its manifest."""
    layer = tar([file(layer_file, b"x")])
    config = b"{}"
    manifest = json.dumps(
        {
            "config": {"digest": digest(config)},
            "layers": [{"digest": digest(layer)}],
        }
    ).encode()
    return {"layer": layer, "config": config, "manifest": manifest}, manifest


def test_the_image_for_this_host_is_picked_from_several(tmp_path: Path) -> None:
    here = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    mine, mine_manifest = manifest_for("mine")
    other, other_manifest = manifest_for("other")
    manifests = [
        {"digest": digest(other_manifest), "platform": {"architecture": "s390x-not-here"}},
        {"digest": digest(mine_manifest), "platform": {"architecture": here}},
    ]
    root, _ = imported(
        tmp_path, index_of(manifests, {**{"o" + k: v for k, v in other.items()}, **mine})
    )
    assert os.listdir(root) == ["mine"]
    with pytest.raises(BadArchive, match=f"lists 2 images, none for {here}"):
        imported(tmp_path / "again", index_of(manifests[:1] * 2, other))


def test_an_index_too_deep_or_a_manifest_without_layers_is_refused(tmp_path: Path) -> None:
    blobs: dict[str, bytes] = {}
    document = json.dumps({"schemaVersion": 2}).encode()
    blobs["bottom"] = document
    with pytest.raises(BadArchive, match="a manifest without layers"):
        imported(tmp_path, index_of([{"digest": digest(document)}], blobs))
    for level in range(5):
        document = json.dumps({"manifests": [{"digest": digest(document)}]}).encode()
        blobs[str(level)] = document
    with pytest.raises(BadArchive, match="a manifest without layers"):
        imported(tmp_path / "deep", index_of([{"digest": digest(document)}], blobs))


def test_a_tar_cut_after_its_first_member_is_refused(tmp_path: Path) -> None:
    archive = tar([file("a", b"a"), file("b", b"b" * 3000)])
    with pytest.raises(BadArchive, match="the archive: a damaged tar"):
        imported(tmp_path, archive[:1600])


@pytest.mark.parametrize("cut", [700, 5000])
def test_a_cut_zstd_stream_is_refused(tmp_path: Path, cut: int) -> None:
    archive = tar([file("a", b"a" * 4000), file("b", os.urandom(20000))], "zst")
    with pytest.raises(BadArchive, match=r"damaged|not a tar archive"):
        imported(tmp_path, archive[:cut])


def test_a_cut_layer_is_refused_naming_the_member(tmp_path: Path) -> None:
    layer = tar([file("big", os.urandom(200_000))], "gz")
    with pytest.raises(BadArchive, match="member 'big': its content is damaged"):
        imported(tmp_path, oci_archive([layer[: len(layer) // 2]]))


def test_a_name_the_filesystem_cannot_hold_is_refused(tmp_path: Path) -> None:
    long_name = "n" * 300
    with pytest.raises(BadArchive, match=f"member '{long_name}/f': File name too long"):
        imported(tmp_path, tar([file(f"{long_name}/f")]))
    with pytest.raises(BadArchive, match="member 'link': File name too long"):
        imported(tmp_path / "again", tar([link("link", "t" * 5000)]))


def test_a_full_disk_is_insufficient_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(InsufficientStorage, match="member 'a': No space left on device"):
        imported(tmp_path, tar([file("a", b"a")]))


def test_the_root_member_other_than_a_directory_is_passed_over(tmp_path: Path) -> None:
    root, _ = imported(tmp_path, tar([link(".", "/elsewhere"), file("a", b"a")]))
    assert os.listdir(root) == ["a"]


def test_without_owners_links_and_files_are_the_daemons(tmp_path: Path) -> None:
    target = tmp_path / "template"
    entries = [file("a", b"a"), link("l", "a")]
    entries[0][0].uid = entries[1][0].uid = 4242
    import_archive(str(target), io.BytesIO(tar(entries)), LIMIT, False)
    assert (target / ROOTFS / "a").stat().st_uid == os.geteuid()
    assert (target / ROOTFS / "l").lstat().st_uid == os.geteuid()


def test_a_layer_cut_between_members_is_refused(tmp_path: Path) -> None:
    # cut after the header of a whiteout: its content is never read, only skipped
    layer = tar([file("a", b"a"), file(".wh.b", b"b" * 3000), file("c")])[:1536]
    with pytest.raises(BadArchive, match=r"layer 'blobs/sha256/[0-9a-f]+': a damaged tar"):
        imported(tmp_path, oci_archive([layer]))


def test_reading_a_deep_tree_keeps_no_record_of_its_members() -> None:
    deep = tar([file(f"usr/share/doc/p{n}/f", b"x") for n in range(50)] + [file("top.json")])
    with tarfile.open(fileobj=io.BytesIO(deep)) as opened:
        archive = sources.Archive(opened, "unused")
        assert list(archive.index) == ["top.json"]
        assert opened.members == []  # type: ignore[attr-defined]
    with tarfile.open(fileobj=io.BytesIO(deep), mode="r|") as streamed:
        names = [member.name for member, _ in sources.members(streamed, "deep")]
        assert len(names) == 51
        assert len(streamed.members) <= 1  # type: ignore[attr-defined]


def test_a_compression_bomb_is_refused_before_its_content_is_written(tmp_path: Path) -> None:
    bomb = tar([file("zeros", bytes(64 << 20))], "gz")
    assert len(bomb) < 1 << 20  # 64 MiB of zeros in well under one
    with pytest.raises(TemplateTooLarge, match="member 'zeros'"):
        imported(tmp_path, bomb, limit=1 << 20)
    assert os.listdir(tmp_path / "template" / ROOTFS) == []


@pytest.mark.skipif(not AS_ROOT, reason="only root gives files away")
def test_as_root_owners_are_kept_and_setuid_survives_the_chown(tmp_path: Path) -> None:
    entries = [directory("home", 0o750), file("home/tool", b"t", 0o4750), link("home/l", "tool")]
    for info, _ in entries:
        info.uid, info.gid = 4242, 4343
    root, _ = imported(tmp_path, tar(entries))
    for name in ("home", "home/tool", "home/l"):
        found = (root / name).lstat()
        assert (found.st_uid, found.st_gid) == (4242, 4343), name
    assert stat.S_IMODE((root / "home/tool").stat().st_mode) == 0o4750
    assert stat.S_IMODE((root / "home").stat().st_mode) == 0o750
