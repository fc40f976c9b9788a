"""The privileged exec wrapper: join the cgroup as root, then drop to the sandbox's identity.

The fallback of :mod:`sandboxd.isolation.exec.helper` (used where the helper was not built).
``wrap(identity, join_files, cwd, argv)`` gives the argv the daemon spawns (as root)::

    sh -c ROOT sandboxd-exec UID GID N JOIN_1 .. JOIN_N sh -c CD_AND_EXEC sh CWD ARGV..

``ROOT`` sets the command's umask (inherited by everything it runs), writes ``0`` (itself)
into every join file (so everything the command ever forks is inside the limits) and resets
``oom_score_adj`` to 0 (the daemon's protective value would be inherited; a value above 0 that
cannot be lowered without ``CAP_SYS_RESOURCE`` is kept, as it protects nothing). Then it
``exec``\\ s ``setsid`` (a new session and process group, which the daemon can
``killpg``; ``setsid`` does not fork when its caller leads no group, and a spawned child never
does) and ``setpriv`` (uid/gid, no supplementary groups, ``no_new_privs``), which runs ``sh`` to
enter ``CWD`` as the sandbox and ``exec`` ``ARGV``: the pid the daemon holds is the command's
own. A failed join exits :data:`JOIN_FAILED` with a message on stderr, and the command never starts.
``ARGV`` travels as positional parameters, never through the shell's parser, so any bytes are
fine.

The command's environment must not reach the root part (``LD_PRELOAD`` in a root ``sh`` is
root code). :func:`spawn_env` makes the environment to spawn with: one made only of names
known to be harmless passes as is; any other is carried as ``__SANDBOXD_<i>=NAME=VALUE``
entries, which no program interprets, and a ``sh`` started after the privilege drop unpacks
them and ``exec``\\ s the command (``env --`` for a name starting with ``-``, which ``exec``
might take as an option). Exit codes stay the shell's: 127 not found, 126 not executable.
"""

import re
import shlex
from collections.abc import Callable, Mapping, Sequence

from attrs import field, frozen

from sandboxd.isolation.base import CD_AND_EXEC, Identity, require_command
from sandboxd.isolation.exec.helper import DEFAULT_UMASK
from sandboxd.isolation.exec.privdrop import SETUP_FAILED, oom_reset_sh, setpriv_args
from sandboxd.isolation.none import find_program

JOIN_FAILED = SETUP_FAILED
"""Exit code of a wrapper that could not put the command in its cgroup (``sandboxd-exec:``)."""

PREFIX = "__SANDBOXD_"
"""Reserved environment prefix: the wrapper's own carrier variables."""

SAFE_NAMES = frozenset({"PATH", "HOME", "TMPDIR", "TERM", "USER", "LOGNAME", "SHELL", "PWD"})
"""Names ``sh``, ``setsid``, ``setpriv`` and the C library do not act on as root."""

LOCALE_NAMES = frozenset(
    {"LANG", "LANGUAGE"}
    | {
        f"LC_{part}"
        for part in [
            "ALL",
            "CTYPE",
            "NUMERIC",
            "TIME",
            "COLLATE",
            "MONETARY",
            "MESSAGES",
            "PAPER",
            "NAME",
            "ADDRESS",
            "TELEPHONE",
            "MEASUREMENT",
            "IDENTIFICATION",
        ]
    }
)
"""Locale names: harmless as long as they name a system locale (no ``/``: not a path)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_ROOT = """\
umask @UMASK@
u=$1 g=$2 n=$3
shift 3
while [ "$n" -gt 0 ]; do
  echo 0 > "$1" || { echo "sandboxd-exec: cannot join cgroup $1" >&2; exit @JOIN_FAILED@; }
  n=$((n - 1))
  shift
done
@OOM_RESET@
if [ -n "${__SANDBOXD_N+x}" ]; then
  exec @SETSID@ -- @SETPRIV@ @DROP@ \\
    -- @SH@ -c @UNPACK@ sandboxd-exec "$@"
fi
exec @SETSID@ -- @SETPRIV@ @DROP@ -- "$@"
"""

_UNPACK = """\
__SANDBOXD_i=0
while [ "$__SANDBOXD_i" -lt "$__SANDBOXD_N" ]; do
  eval "__SANDBOXD_kv=\\${__SANDBOXD_$__SANDBOXD_i}"
  unset "__SANDBOXD_$__SANDBOXD_i"
  export "$__SANDBOXD_kv"
  __SANDBOXD_i=$((__SANDBOXD_i + 1))
done
unset __SANDBOXD_i __SANDBOXD_kv __SANDBOXD_N
case $1 in -*) exec @ENV@ -- "$@" ;; esac
exec "$@"
"""


def _fill(template: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    return template


def _root_script(programs: "Programs", umask: int = DEFAULT_UMASK) -> str:
    q = shlex.quote
    unpack = _fill(_UNPACK, {"ENV": q(programs.env)})
    return _fill(
        _ROOT,
        {
            "JOIN_FAILED": str(JOIN_FAILED),
            "OOM_RESET": oom_reset_sh("sandboxd-exec"),
            "DROP": " ".join(setpriv_args('"$u"', '"$g"')),
            "SETSID": q(programs.setsid),
            "SETPRIV": q(programs.setpriv),
            "SH": q(programs.sh),
            "UNPACK": q(unpack),
            "UMASK": f"{umask:03o}",
        },
    )


@frozen
class Programs:
    """Absolute paths of the programs the wrapper runs, resolved once at start-up."""

    sh: str
    setsid: str
    setpriv: str
    env: str

    @classmethod
    def find(cls, which: Callable[[str], str] = find_program) -> "Programs":
        """Resolve each program; ``which`` raises ``IsolationUnavailable`` for a missing one."""
        return cls(
            sh=which("sh"), setsid=which("setsid"), setpriv=which("setpriv"), env=which("env")
        )


@frozen
class Wrapper:
    """``Isolation.wrap`` for the cgroup drivers (call it with identity, procs files, argv)."""

    programs: Programs
    umask: int = DEFAULT_UMASK
    script: str = field(init=False)

    @script.default
    def _script(self) -> str:
        return _root_script(self.programs, self.umask)

    def __call__(
        self, identity: Identity, join_files: Sequence[str], cwd: str, argv: Sequence[str]
    ) -> list[str]:
        """The argv to spawn as root for ``argv`` to run as ``identity`` in its cgroup and cwd."""
        require_command(argv, identity)
        return [
            self.programs.sh,
            "-c",
            self.script,
            "sandboxd-exec",
            str(identity.uid),
            str(identity.gid),
            str(len(join_files)),
            *join_files,
            self.programs.sh,
            "-c",
            CD_AND_EXEC,
            "sh",
            cwd,
            *argv,
        ]


def _harmless(name: str, value: str) -> bool:
    if name in SAFE_NAMES:
        return True
    return name in LOCALE_NAMES and "/" not in value


def spawn_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment to spawn a wrapped argv with, for a command whose environment is ``env``.

    ``ValueError`` for a name that is not a shell identifier or uses the reserved prefix, and
    for a non-numeric ``OPTIND`` (the shell that unpacks would refuse it).
    """
    for name, value in env.items():
        if _NAME.fullmatch(name) is None:
            raise ValueError(f"environment name {name!r} is not a shell identifier")
        if name.startswith(PREFIX):
            raise ValueError(f"environment name {name!r} uses the reserved prefix {PREFIX}")
        if name == "OPTIND" and not value.isdigit():
            raise ValueError(f"environment OPTIND={value!r} is not a number")
        if "\0" in value:
            raise ValueError(f"environment {name} holds a NUL byte")
    if all(_harmless(name, value) for name, value in env.items()):
        return dict(env)
    carried = {f"{PREFIX}{i}": f"{name}={value}" for i, (name, value) in enumerate(env.items())}
    carried[f"{PREFIX}N"] = str(len(env))
    return carried
