"""A sandbox's CA bundle rewritten in place (docs/isolation.rst, "Header rules over HTTPS"):
the same inode (what the bind in its mount namespace shows), never a link followed, never a
file made."""

import os
from pathlib import Path

import pytest

from sandboxd.isolation.namespaces.identity_files import (
    TEMPLATE_BUNDLE_MAX,
    TRUST_FILE,
    rewrite_trust_file,
    template_bundle,
    write_trust_file,
)
from sandboxd.isolation.namespaces.pins import Namespaces


def test_the_bundle_is_rewritten_in_place(tmp_path: Path) -> None:
    write_trust_file(str(tmp_path), b"HOST CAS\n")
    inode = (tmp_path / TRUST_FILE).stat().st_ino
    assert rewrite_trust_file(str(tmp_path), b"HOST CAS\nTHE CA\n")
    assert (tmp_path / TRUST_FILE).read_bytes() == b"HOST CAS\nTHE CA\n"
    Namespaces(frozenset({"mount"}), str(tmp_path.parent)).retrust(tmp_path.name, b"HOST\n")
    assert (tmp_path / TRUST_FILE).read_bytes() == b"HOST\n"  # (cut to the new length)
    assert (tmp_path / TRUST_FILE).stat().st_ino == inode


def test_no_file_is_made_and_no_link_followed(tmp_path: Path) -> None:
    assert not rewrite_trust_file(str(tmp_path), b"CA")
    Namespaces().retrust("x", b"CA")  # (no mount namespace: nothing)
    assert not os.listdir(tmp_path)
    (tmp_path / "elsewhere").write_bytes(b"kept")
    (tmp_path / TRUST_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        rewrite_trust_file(str(tmp_path), b"CA")
    assert (tmp_path / "elsewhere").read_bytes() == b"kept"


def test_a_templates_own_bundle_is_read_without_following_a_link(tmp_path: Path) -> None:
    certs = tmp_path / "t/etc/ssl/certs"
    assert template_bundle(str(tmp_path / "none")) == b""
    certs.mkdir(parents=True)
    assert template_bundle(str(tmp_path / "t")) == b""  # (no file)
    (certs / "ca-certificates.crt").mkdir()
    assert template_bundle(str(tmp_path / "t")) == b""  # (not a file)
    (certs / "ca-certificates.crt").rmdir()
    (certs / "ca-certificates.crt").write_bytes(b"OWN")
    assert template_bundle(str(tmp_path / "t")) == b"OWN"
    (certs / "ca-certificates.crt").write_bytes(b"x" * (TEMPLATE_BUNDLE_MAX + 1))
    assert template_bundle(str(tmp_path / "t")) == b""  # (too large)
    (tmp_path / "host/etc/ssl").mkdir(parents=True)
    (tmp_path / "u/etc").mkdir(parents=True)
    (tmp_path / "u/etc/ssl").symlink_to(tmp_path / "t/etc/ssl")  # (a template's own link)
    assert template_bundle(str(tmp_path / "u")) == b""
