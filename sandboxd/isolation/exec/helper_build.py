"""Build the daemon's C programs with the C compiler: ``sandboxd-exec``, the exec helper, from
``sandboxd_exec.c``, and ``sandboxd-judge``, the egress judge, from
``sandboxd/isolation/network/sandboxd_judge.c``.

Standard library only: ``setup.py`` loads this file by path while the project's dependencies may
not be installed yet. A program is linked statically when the C library allows it (no dynamic
loader runs in the root part of an exec), else dynamically. Without a C compiler nothing is
built: the daemon uses its shell chain (``sh``, ``setsid``, ``setpriv``) to exec, slower and
equally isolated, and its egress proxy for every policy by name.

    python -m sandboxd.isolation.exec.helper_build     # build them next to their sources
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

SOURCE = Path(__file__).with_name("sandboxd_exec.c")
HELPER_NAME = "sandboxd-exec"
JUDGE_SOURCE = Path(__file__).parents[1] / "network" / "sandboxd_judge.c"
JUDGE_NAME = "sandboxd-judge"


class Program(NamedTuple):
    """One C program: its source, the name it is built as, what the daemon does without it."""

    source: Path
    name: str
    without: str


HELPER = Program(SOURCE, HELPER_NAME, "exec uses the shell chain")
JUDGE = Program(JUDGE_SOURCE, JUDGE_NAME, "egress by name goes through the proxy alone")
PROGRAMS = (HELPER, JUDGE)
FLAGS = ("-O2", "-s", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2")

RunCompiler = Callable[[Sequence[str]], int]
"""Runs the C compiler's argv to its end: its exit code (standard library only, unlike
:data:`~sandboxd.isolation.base.RunProgram`: this file is loaded by path)."""


def _run(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), check=False, timeout=300).returncode


def find_compiler(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """``$CC``, else ``cc`` or ``gcc`` on ``PATH``; ``None`` when there is none."""
    wanted = os.environ.get("CC")
    for name in [wanted] if wanted else ["cc", "gcc"]:
        path = which(name)
        if path is not None:
            return path
    return None


def build(
    target: Path,
    compiler: str | None = None,
    run: RunCompiler = _run,
    program: Program = HELPER,
) -> bool:
    """Compile ``program`` to ``target`` (mode 0755); ``False`` when it could not be built."""
    compiler = compiler or find_compiler()
    if compiler is None:
        print(f"{program.name}: no C compiler: {program.without}", file=sys.stderr)
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    for link in (["-static"], []):
        if run([compiler, *FLAGS, *link, "-o", str(partial), str(program.source)]) == 0:
            partial.chmod(0o755)
            partial.replace(target)
            return True
    partial.unlink(missing_ok=True)
    print(f"{program.name}: {compiler} failed: {program.without}", file=sys.stderr)
    return False


def build_all(base: Path | None = None) -> bool:
    """Build every program: beside its source, or at the same place under ``base`` (a build
    tree's root); ``False`` when one could not be built."""
    root = Path(__file__).parents[3]
    built = True
    for program in PROGRAMS:
        beside = program.source.with_name(program.name)
        target = beside if base is None else base / beside.relative_to(root)
        built = build(target, program=program) and built
    return built


def main() -> int:
    """Build the programs beside their sources (a work tree's own); 1 when one could not be."""
    return 0 if build_all() else 1


if __name__ == "__main__":
    sys.exit(main())
