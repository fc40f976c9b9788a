"""The exec helper ``sandboxd-exec``: a sandbox's command started in one exec, no shell between.

The isolated chain ``sh`` (join the cgroup) → ``setsid`` → ``setpriv`` → ``sh`` (``cd``) →
command costs four program starts before the command's own (see docs/performance.rst); the
helper, a small static C program built with the package
(``sandboxd_exec.c``, ``helper_build.py``), does the same steps in the same order in one
(``sandboxd_exec.c`` says which, and the exit codes). Without it (no C compiler where the
package was built) the daemon keeps the shell chain of :mod:`sandboxd.isolation.exec.wrapper`.

The helper runs as root in the isolated modes, so it is only used when nobody but root can
change it: a regular executable file owned by root, writable neither by group nor others, in a
directory likewise.
"""

import os
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from attrs import frozen

from sandboxd.isolation.base import Identity, RunProgram, require_command
from sandboxd.isolation.exec.helper_build import HELPER_NAME

HELPER = str(Path(__file__).with_name(HELPER_NAME))
"""Where the build puts the helper: beside this module."""

DEFAULT_UMASK = 0o077


def run_program(argv: Sequence[str]) -> tuple[int, str]:
    """A :data:`~sandboxd.isolation.base.RunProgram` with :mod:`subprocess` (start-up only: it
    blocks): its stdout and stderr together."""
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=30, check=False, env={}
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def seccomp_problem(helper: str, run: RunProgram = run_program) -> str | None:
    """Why the helper's seccomp filter is not enforced here (``None``: it is).

    ``sandboxd-exec seccomp-check`` applies the filter to itself and tries what it must refuse.
    """
    code, output = run([helper, "seccomp-check"])
    if code == 0:
        return None
    return output.removeprefix("sandboxd-exec: ") or f"seccomp-check exited {code}"


def _options(
    umask: int, seccomp: bool | None = None, no_ptrace: bool = False, ctty: bool = False
) -> list[str]:
    options = [f"--umask={umask:03o}"]
    if seccomp is not None:
        options.append("--seccomp=default" if seccomp else "--seccomp=off")
    if no_ptrace:
        options.append("--no-ptrace")
    if ctty:
        options.append("--ctty")
    return options


def helper_problem(
    path: str, as_root: bool, lstat: Callable[[str], os.stat_result] = os.lstat
) -> str | None:
    """Why the helper at ``path`` cannot be used (``None``: it can).

    ``as_root``: the daemon runs it as root, so the file and its directory must be root's alone.
    """
    try:
        st = lstat(path)
        parent = lstat(os.path.dirname(path))
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IXUSR:
        return f"{path} is not an executable file"
    if as_root:
        for what, info in ((path, st), (os.path.dirname(path), parent)):
            if info.st_uid != 0 or info.st_mode & 0o022:
                return f"{what} must be owned by root and writable by root alone"
    return None


@frozen
class HelperWrapper:
    """``Isolation.wrap`` for the cgroup drivers: join, setsid, drop to ``identity``, filter
    system calls (``seccomp``), cd, exec with ``umask``; with ``no_ptrace`` (the daemon's own
    work as a sandbox), exec so that no process of the sandbox can ptrace what it starts; with
    ``ctty`` (a terminal's command, spawned on a pseudo-terminal), its fd 0 becomes the
    session's controlling terminal."""

    helper: str
    seccomp: bool = True
    umask: int = DEFAULT_UMASK
    no_ptrace: bool = False
    ctty: bool = False

    def __call__(
        self, identity: Identity, join_files: Sequence[str], cwd: str, argv: Sequence[str]
    ) -> list[str]:
        """The argv to spawn as root for ``argv`` to run as ``identity`` in its cgroup and cwd."""
        require_command(argv, identity)
        return [
            self.helper,
            *_options(self.umask, self.seccomp, self.no_ptrace, self.ctty),
            "sandbox",
            str(identity.uid),
            str(identity.gid),
            cwd,
            str(len(join_files)),
            *join_files,
            *argv,
        ]


@frozen
class HelperSession:
    """``Isolation.wrap`` for ``--isolation=none``: a new session, cd, exec with ``umask`` (no
    uid, no cgroup, no filter); ``ctty`` as for :class:`HelperWrapper`."""

    helper: str
    umask: int = DEFAULT_UMASK
    ctty: bool = False

    def __call__(
        self, identity: Identity, join_files: Sequence[str], cwd: str, argv: Sequence[str]
    ) -> list[str]:
        require_command(argv)
        return [self.helper, *_options(self.umask, ctty=self.ctty), "session", cwd, *argv]
