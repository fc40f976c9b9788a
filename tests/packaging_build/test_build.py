"""``python -m build`` gives an sdist and a wheel; the wheel alone, installed into a fresh venv,
gives a working ``twistd sandboxd`` and ``sandboxctl``.

The build runs on a clean copy of the work tree (outside it, so no ``build/`` or egg-info is
left behind). ``python -m build`` builds the wheel *from the sdist*, so a file missing from
the sdist fails here too. The install needs the package index for the dependencies, like any
``pip install``.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import venv
import zipfile
from pathlib import Path

import pytest

from sandboxd.isolation.exec.helper_build import find_compiler
from tests.support.daemon import REPO, Daemon, free_port, stop_daemon

pytestmark = [pytest.mark.slow, pytest.mark.wide]


def clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "COVERAGE_PROCESS_START", "SANDBOXD_URL", "SANDBOXD_TOKEN_FILE")
        and not k.startswith("SANDBOXD_")
    }


def tree_copy(target: Path) -> None:
    """The work tree as it is: tracked and new files, nothing git ignores."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = REPO / raw.decode()
        if source.is_file():
            (target / raw.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / raw.decode())


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the build package is not installed (pip install build)")
    base = tmp_path_factory.mktemp("build")
    source = base / "src"
    tree_copy(source)
    out = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        check=True,
        cwd=base,
        env=clean_env(),
        capture_output=True,
        timeout=600,
    )
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel (and its dependencies) installed."""
    env_dir = tmp_path_factory.mktemp("venv") / "venv"
    venv.create(env_dir, with_pip=True)
    (wheel,) = dist.glob("*.whl")
    subprocess.run(
        [env_dir / "bin" / "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        env=clean_env(),
        cwd=env_dir,
        timeout=600,
    )
    return env_dir


def test_sdist_and_wheel(dist: Path) -> None:
    (sdist,) = dist.glob("sandboxd-*.tar.gz")
    # With a C compiler the wheel carries the exec helper, so it is this platform's.
    (wheel,) = dist.glob("sandboxd-*-py3-none-*.whl")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for needed in ("setup.py", "pyproject.toml", "README.rst", "sandboxd/tap.py"):
        assert needed in names, needed
    with zipfile.ZipFile(wheel) as whl:
        files = set(whl.namelist())
    assert "twisted/plugins/sandboxd_plugin.py" in files
    assert "sandboxd/notify.py" in files
    assert "sandboxd_client/cli/__init__.py" in files
    assert "sandboxd_client/py.typed" in files
    assert "sandboxd/isolation/exec/sandboxd_exec.c" in files
    # Every package of the tree is shipped (one missing from setup.py fails only installed).
    for top in ("sandboxd", "sandboxd_client"):
        for source in sorted((REPO / top).rglob("*.py")):
            shipped = source.relative_to(REPO).as_posix()
            assert shipped in files, f"{shipped} is not in the wheel: add its package to setup.py"
    if find_compiler() is not None:
        assert wheel.name.endswith("-py3-none-linux_x86_64.whl")
        assert "sandboxd/isolation/exec/sandboxd-exec" in files
        with zipfile.ZipFile(wheel) as whl:
            mode = whl.getinfo("sandboxd/isolation/exec/sandboxd-exec").external_attr >> 16
        assert mode & 0o777 == 0o755
    # Never shipped: it would shadow every other package's twisted plugins.
    assert "twisted/__init__.py" not in files
    assert "twisted/plugins/__init__.py" not in files
    entry_points = next(n for n in files if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as whl:
        assert "sandboxctl = sandboxd_client.cli:main" in whl.read(entry_points).decode()


def test_twistd_sandboxd_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    bin_dir = installed / "bin"
    # The plugin cache as an image build regenerates it.
    subprocess.run(
        [
            bin_dir / "python",
            "-c",
            "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))",
        ],
        check=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=120,
    )
    port = free_port()
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                bin_dir / "twistd",
                "--nodaemon",
                "--pidfile=",
                "sandboxd",
                "--isolation=none",
                f"--root={tmp_path / 'root'}",
                f"--listen=tcp:{port}:interface=127.0.0.1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=tmp_path,
        )
    daemon = Daemon(process, port, tmp_path / "root", log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if daemon.call("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

        def sandboxctl(*args: str) -> subprocess.CompletedProcess[str]:
            env = clean_env()
            env["SANDBOXD_URL"] = daemon.url
            return subprocess.run(
                [str(bin_dir / "sandboxctl"), *args],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp_path,
                timeout=120,
            )

        health = sandboxctl("health")
        assert health.returncode == 0, health.stderr
        assert "ok" in health.stdout
        created = sandboxctl("create")
        assert created.returncode == 0, created.stderr
        handle = created.stdout.strip().splitlines()[-1]
        ran = sandboxctl("exec", handle, "--", "sh", "-c", "echo from-the-wheel; exit 3")
        assert ran.returncode == 3, ran.stderr
        assert "from-the-wheel" in ran.stdout
        listed = daemon.json("GET", "/sandboxes")
        assert len(listed["sandboxes"]) == 1, json.dumps(listed)
        assert sandboxctl("kill", handle).returncode == 0
    finally:
        stop_daemon(daemon)
