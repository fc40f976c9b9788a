"""Building the exec helper: the real C compiler where there is one, the fallbacks without."""

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from sandboxd.isolation.exec import helper_build
from sandboxd.isolation.exec.helper_build import JUDGE, SOURCE, build, find_compiler

has_cc = pytest.mark.skipif(find_compiler() is None, reason="no C compiler here")


@has_cc
def test_builds_a_working_helper(tmp_path: Path) -> None:
    target = tmp_path / "bin" / "sandboxd-exec"
    assert build(target)
    assert os.stat(target).st_mode & 0o777 == 0o755
    assert not target.with_name("sandboxd-exec.part").exists()
    done = subprocess.run(
        [str(target), "session", str(tmp_path), "pwd"], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout) == (0, f"{tmp_path}\n")


@has_cc
def test_builds_a_working_judge(tmp_path: Path) -> None:
    target = tmp_path / "sandboxd-judge"
    assert build(target, program=JUDGE)
    request = b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"
    done = subprocess.run([str(target), "peek"], input=request, capture_output=True, check=False)
    assert done.stdout == b"name a.example\n"


def test_compiler_from_cc_else_cc_or_gcc(monkeypatch: pytest.MonkeyPatch) -> None:
    found = {"clang": "/opt/clang", "gcc": "/usr/bin/gcc"}
    monkeypatch.setenv("CC", "clang")
    assert find_compiler(found.get) == "/opt/clang"
    monkeypatch.delenv("CC")
    assert find_compiler(found.get) == "/usr/bin/gcc"
    assert find_compiler(lambda name: None) is None


def test_no_compiler_builds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert not build(tmp_path / "sandboxd-exec")
    assert not (tmp_path / "sandboxd-exec").exists()
    assert "no C compiler" in capsys.readouterr().err


def test_links_dynamically_when_static_fails(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> int:
        calls.append(list(argv))
        if "-static" in argv:
            return 1
        Path(argv[argv.index("-o") + 1]).write_bytes(b"\x7fELF")
        return 0

    target = tmp_path / "sandboxd-exec"
    assert build(target, "/usr/bin/cc", run)
    assert ["-static" in argv for argv in calls] == [True, False]
    assert target.read_bytes() == b"\x7fELF"
    assert os.stat(target).st_mode & 0o777 == 0o755


def test_a_failing_compiler_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(argv: Sequence[str]) -> int:
        Path(argv[argv.index("-o") + 1]).write_bytes(b"partial")
        return 1

    target = tmp_path / "sandboxd-exec"
    assert not build(target, "/usr/bin/cc", run)
    assert list(tmp_path.iterdir()) == []
    assert "failed" in capsys.readouterr().err


def test_main_builds_each_program_beside_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple[Path, str]] = []

    def fake(target: Path, program: helper_build.Program) -> bool:
        built.append((target, program.name))
        return True

    monkeypatch.setattr(helper_build, "build", fake)
    assert helper_build.main() == 0
    network = helper_build.SOURCE.parents[1] / "network"
    assert built == [
        (helper_build.SOURCE.with_name("sandboxd-exec"), "sandboxd-exec"),
        (network / "sandboxd-judge", "sandboxd-judge"),
    ]
    only_exec = lambda target, program: program.name == "sandboxd-exec"  # noqa: E731
    monkeypatch.setattr(helper_build, "build", only_exec)
    assert helper_build.main() == 1


def test_a_build_tree_gets_each_program_at_its_package_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built: list[Path] = []

    def fake(target: Path, program: helper_build.Program) -> bool:
        built.append(target)
        return True

    monkeypatch.setattr(helper_build, "build", fake)
    assert helper_build.build_all(tmp_path)
    assert built == [
        tmp_path / "sandboxd" / "isolation" / "exec" / "sandboxd-exec",
        tmp_path / "sandboxd" / "isolation" / "network" / "sandboxd-judge",
    ]


def test_every_file_the_helper_includes_is_shipped() -> None:
    """A header left out of ``package_data`` makes a wheel built from an sdist fail to compile
    the helper, which then silently falls back to the shell chain."""
    setup = (SOURCE.parents[3] / "setup.py").read_text()
    included = {
        name
        for program in helper_build.PROGRAMS
        for path in program.source.parent.glob("sandboxd_*.[ch]")
        for name in re.findall(r'#include "([^"]+)"', path.read_text())
    }
    assert {"sandboxd_exec_noptrace.h", "sandboxd_judge_flows.h"} <= included
    assert {name for name in included if f'"{name}"' not in setup} == set()
