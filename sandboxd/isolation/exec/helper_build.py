"""Build ``sandboxd-exec``, the exec helper, from ``sandboxd_exec.c`` with the C compiler.

Standard library only: ``setup.py`` loads this file by path while the project's dependencies may
not be installed yet. The helper is linked statically when the C library allows it (no dynamic
loader runs in the root part of an exec), else dynamically. Without a C compiler nothing is
built and the daemon uses its shell chain (``sh``, ``setsid``, ``setpriv``) instead: slower,
equally isolated.

    python -m sandboxd.isolation.exec.helper_build     # build it next to the source (a work tree)
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

SOURCE = Path(__file__).with_name("sandboxd_exec.c")
HELPER_NAME = "sandboxd-exec"
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


def build(target: Path, compiler: str | None = None, run: RunCompiler = _run) -> bool:
    """Compile the helper to ``target`` (mode 0755); ``False`` when it could not be built."""
    compiler = compiler or find_compiler()
    if compiler is None:
        print(f"{HELPER_NAME}: no C compiler: exec uses the shell chain", file=sys.stderr)
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    for link in (["-static"], []):
        if run([compiler, *FLAGS, *link, "-o", str(partial), str(SOURCE)]) == 0:
            partial.chmod(0o755)
            partial.replace(target)
            return True
    partial.unlink(missing_ok=True)
    print(f"{HELPER_NAME}: {compiler} failed: exec uses the shell chain", file=sys.stderr)
    return False


def main() -> int:
    """Build the helper beside its source (a work tree's own); 1 when it could not be."""
    return 0 if build(SOURCE.with_name(HELPER_NAME)) else 1


if __name__ == "__main__":
    sys.exit(main())
