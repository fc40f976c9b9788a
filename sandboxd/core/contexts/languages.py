"""The languages a context may speak: each one's kernel, how it starts, and the silent cells the
daemon sends it (its working directory, an execution's environment).

Both run on ``SANDBOXD_KERNEL_PYTHON``: ``python`` is Jupyter's ``ipykernel``; ``bash`` is
:mod:`sandboxd.core.contexts.shell_kernel`, its text given as ``python3 -c`` (ipykernel's
``Kernel`` class keeping a ``bash -i`` on pipes) (docs/extensions.rst, "Contexts").
"""

import json
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from attrs import frozen

SHELL_KERNEL = Path(__file__).with_name("shell_kernel.py").read_text(encoding="utf-8")
"""The bash kernel's program (run in the sandbox, never imported here)."""

TUNING = Path(__file__).with_name("kernel_tuning.py").read_text(encoding="utf-8")
"""What both kernels' programs do first (:mod:`sandboxd.core.contexts.kernel_tuning`)."""

TUNING_ARGS = ("--Kernel._execute_sleep=0",)
"""The command-line half of the tuning: no sleep after each cell."""

PROGRAM_START = (
    "import sys\n"
    "if sys.path[0] == '':\n"
    "    del sys.path[0]\n"  # as ipykernel_launcher does: no module of the cwd shadows one
    f"{TUNING}\n"
    "tune_ipykernel()\n"
)
"""The start of both kernels' programs: the working directory's modules out of the way while
the kernel loads (IPython puts it back for the cells), then the tuning."""

PYTHON_PROGRAM = (
    PROGRAM_START + "from ipykernel import kernelapp\nkernelapp.launch_new_instance()\n"
)
"""Python's kernel: ``ipykernel_launcher``'s, tuned."""

BASH_PROGRAM = PROGRAM_START + f"exec(compile({SHELL_KERNEL!r}, 'sandboxd-bash-kernel', 'exec'))\n"
"""The bash kernel, tuned (compiled apart: its ``__future__`` import must come first)."""

PROBE = (
    "import importlib.util, json, shutil, sys\n"
    "found = {m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}\n"
    "found['bash'] = shutil.which('bash') is not None\n"
    "print(json.dumps(found))\n"
)
"""Which modules the kernel's python finds (none imported), and whether it has a bash."""

PROBE_TIMEOUT = 30.0
"""Seconds the kernel's python may take to say which modules it has."""

SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@frozen
class Language:
    """One language's kernel: how the kernel's python runs it (``-m module`` or ``-c
    program``), its arguments, and the modules (and programs) it needs."""

    name: str
    run: tuple[str, str]
    args: tuple[str, ...]
    needs: tuple[str, ...]
    hint: str
    """How to provide what it needs, said when it is missing."""

    def argv(self, python: str, connection_file: str) -> tuple[str, ...]:
        """The kernel's command line."""
        return (python, *self.run, "-f", connection_file, *self.args)

    def chdir_code(self, cwd: str) -> str:
        """The silent cell that enters ``cwd``."""
        if self.name == "bash":
            return f"cd -- {shlex.quote(cwd)}"
        return f"import os; os.chdir({cwd!r})"

    def env_code(self, env: Mapping[str, str]) -> tuple[str, str]:
        """The silent cells that set ``env`` for one execution and then put it back;
        ``ValueError`` for a name the language cannot hold."""
        if self.name == "bash":
            return _bash_env_code(env)
        return _python_env_code(env)


PYTHON = Language(
    "python",
    ("-c", PYTHON_PROGRAM),
    ("--HistoryManager.hist_file=:memory:", "--colors=NoColor", *TUNING_ARGS),
    ("ipykernel",),
    "install ipykernel (Debian: python3-ipykernel) or set SANDBOXD_KERNEL_PYTHON",
)
BASH = Language(
    "bash",
    ("-c", BASH_PROGRAM),
    TUNING_ARGS,
    ("ipykernel", "bash"),
    "install ipykernel (Debian: python3-ipykernel) and bash",
)
LANGUAGES = {language.name: language for language in (PYTHON, BASH)}
"""Every language a context may speak, where the host has its kernel."""


@frozen
class Kernels:
    """What the host's kernel python can run: :attr:`languages` (in :data:`LANGUAGES`'
    order), and why each other one cannot (:attr:`missing`)."""

    languages: tuple[str, ...]
    missing: Mapping[str, str]


def probe_kernels(python: str, timeout: float = PROBE_TIMEOUT) -> Kernels:
    """Ask ``python`` once (tens of ms) which of :data:`LANGUAGES` it has the modules of; one
    that does not answer within ``timeout`` seconds has none. Blocking: run in a thread."""
    modules = sorted({need for lang in LANGUAGES.values() for need in lang.needs} - {"bash"})
    try:
        done = subprocess.run(
            [python, "-c", PROBE, *modules], capture_output=True, timeout=timeout, check=False
        )
        found = json.loads(done.stdout) if done.returncode == 0 else {}
    except OSError as e:
        reason = f"{python} cannot run ({e.strerror}): set SANDBOXD_KERNEL_PYTHON"
        return Kernels((), dict.fromkeys(LANGUAGES, reason))
    except subprocess.TimeoutExpired:
        reason = f"{python} did not answer within {timeout:g}s: set SANDBOXD_KERNEL_PYTHON"
        return Kernels((), dict.fromkeys(LANGUAGES, reason))
    except ValueError:
        found = {}
    languages: list[str] = []
    missing: dict[str, str] = {}
    for language in LANGUAGES.values():
        absent = [need for need in language.needs if not found.get(need)]
        if absent:
            missing[language.name] = f"{python} has no {', '.join(absent)}: {language.hint}"
        else:
            languages.append(language.name)
    return Kernels(tuple(languages), missing)


def _python_env_code(env: Mapping[str, str]) -> tuple[str, str]:
    names = json.dumps(dict(env))
    before = (
        "import os as __sbx_os, json as __sbx_json\n"
        f"__sbx_env = __sbx_json.loads({names!r})\n"
        "__sbx_saved = {k: __sbx_os.environ.get(k) for k in __sbx_env}\n"
        "__sbx_os.environ.update(__sbx_env)\n"
    )
    after = (
        "for __sbx_k, __sbx_v in __sbx_saved.items():\n"
        "    if __sbx_v is None: __sbx_os.environ.pop(__sbx_k, None)\n"
        "    else: __sbx_os.environ[__sbx_k] = __sbx_v\n"
        "del __sbx_env, __sbx_saved\n"
    )
    return before, after


def _bash_env_code(env: Mapping[str, str]) -> tuple[str, str]:
    bad = [name for name in env if not SHELL_NAME.match(name)]
    if bad:
        raise ValueError(f"env: {', '.join(map(repr, bad))} cannot be a bash variable's name")
    before: list[str] = []
    after: list[str] = []
    for number, (name, value) in enumerate(env.items()):
        had, old = f"__sbx_had{number}", f"__sbx_old{number}"
        before.append(
            f'if [ "${{{name}+set}}" = set ]; then {had}=1; {old}=${name}; else {had}=; fi;'
            f" export {name}={shlex.quote(value)}"
        )
        after.append(
            f'if [ -n "${had}" ]; then export {name}="${old}"; else unset {name}; fi;'
            f" unset {had} {old}"
        )
    return "\n".join(before), "\n".join(after)


def names(languages: Sequence[str]) -> str:
    return ", ".join(languages) or "none"
