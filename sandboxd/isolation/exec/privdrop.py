"""How a process of a sandbox starts: the privilege-drop steps, specified once.

Every process the daemon starts as a sandbox's uid starts through one chain,
:meth:`sandboxd.isolation.sandbox.SandboxIsolation.start_argv` (docs/isolation.rst, "The
privilege-drop chain"): the sandbox's commands and background processes, and the workspace end of an
archive copy (:mod:`sandboxd.core.archive.rsync`), which is the daemon's own work and so is started
with the helper's ``--no-ptrace`` as well. ``tests/unit/test_unit_privdrop_sites.py`` lists every
place the daemon starts a process and holds each to it. The chain is the C helper
(``sandboxd_exec.c``: ``enter``, then ``sandbox`` mode) or, where it was not built, its shell
fallback (``nsenter``, then :mod:`sandboxd.isolation.exec.wrapper`). After entering the sandbox's
namespaces, it follows these steps, in this order, with these rules:

1. **join**: write ``0`` (itself) into every join file of the sandbox's cgroups, so everything
   it ever forks is inside the limits. A failure exits :data:`SETUP_FAILED`.
2. **oom**: reset ``oom_score_adj`` to 0 (the daemon's protective, negative value would be
   inherited). A value above 0 that cannot be lowered (no ``CAP_SYS_RESOURCE``) is kept, as it
   protects nothing; one below 0 that cannot be reset exits :data:`SETUP_FAILED`.
3. **session**: ``setsid``, a new session and process group the daemon can ``killpg`` (the
   commands; rsync's end is a child of the rsync the daemon holds and ends with it).
4. **drop**: no supplementary groups, then the gid, then the uid, and ``no_new_privs``
   (:func:`setpriv_args`); then the seccomp filter (the helper only: the shell chain has none,
   for any process). A failure exits :data:`SETUP_FAILED`.
5. **cd**: enter the working directory as the sandbox's uid, so a component the sandbox swapped
   for a symlink gets it nothing its uid could not reach.
6. **exec** the command (``--no-ptrace``: from an execute-only copy, so the kernel keeps it
   non-dumpable and no process of the sandbox's uid can ptrace it or read its memory).
"""

import shlex

SETUP_FAILED = 125
"""Exit code of a chain that could not do steps 1, 2 or 4: the command never starts."""

OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def oom_reset_sh(who: str, path: str = OOM_SCORE_ADJ) -> str:
    """Step 2 as one line of ``sh`` (no single quote: one line of the shell chain's script)."""
    where = shlex.quote(path)
    return (
        f"if ! {{ echo 0 > {where}; }} 2>/dev/null; then read -r adj < {where}; "
        f'[ "$adj" -ge 0 ] || {{ echo "{who}: cannot reset oom_score_adj" >&2; '
        f"exit {SETUP_FAILED}; }}; fi"
    )


def setpriv_args(uid: str, gid: str) -> list[str]:
    """Step 4 as ``setpriv`` options (``uid`` and ``gid`` as the shell words to pass)."""
    return [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs"]
