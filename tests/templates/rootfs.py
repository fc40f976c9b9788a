"""A root filesystem tarball made in the tests from host binaries: a static busybox and its
applets, a setuid-root copy of ``id`` with its libraries (found by ``ldd``), and on request
other host programs (``bash``, which the E2B SDK starts every command with)."""

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.templates.archives import Entry, directory, file, link, tar

APPLETS = (
    "sh",
    "ls",
    "cat",
    "echo",
    "whoami",
    "id",
    "test",
    "pwd",
    "mkdir",
    "rm",
    "stat",
    "head",
    "chmod",
    "ln",
    "readlink",
    "sleep",
)
OS_RELEASE = b'ID=made-in-test\nPRETTY_NAME="a template made in the test"\n'


def host_binary(path: str, name: str, mode: int) -> list[Entry]:
    """``path`` of the host as ``name`` (``mode``, root's) in a template, with every library
    ``ldd`` names at its own path."""
    entries = [file(name, Path(path).read_bytes(), mode)]
    listing = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    for library in sorted(set(re.findall(r"(/\S+) \(0x", listing))):
        real = os.path.realpath(library)
        entries.append(file(library.lstrip("/"), Path(real).read_bytes(), 0o755))
    return entries


def rootfs(*programs: str, extra: Sequence[Entry] = ()) -> bytes:
    """The test's template: busybox applets in ``bin/``, an ``os-release``, a world-writable
    ``scratch/`` (where a sandbox can change the template's tree), a setuid-root ``id``, and
    each of ``programs`` (host paths, with their libraries) at its own path; then ``extra``."""
    busybox = shutil.which("busybox")
    if busybox is None:  # pragma: no cover - Debian's busybox-static is in the test image
        pytest.skip("no busybox on this host")
    entries = [
        directory("bin"),
        directory("etc"),
        directory("lib"),
        directory("lib64"),
        directory("lib/x86_64-linux-gnu"),
        directory("scratch", 0o1777),
        file("bin/busybox", Path(busybox).read_bytes(), 0o755),
        file("etc/os-release", OS_RELEASE),
        *[link(f"bin/{applet}", "busybox") for applet in APPLETS],
        *host_binary("/usr/bin/id", "bin/id-setuid", 0o4755),
    ]
    for program in programs:
        entries += host_binary(program, program.lstrip("/"), 0o755)
    entries += extra
    seen: set[str] = set()
    unique = []
    for info, data in entries:
        if info.name not in seen:
            seen.add(info.name)
            unique.append((info, data))
    return tar(unique)
