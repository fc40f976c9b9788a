"""The languages a context may speak in a sandbox made from a template (docs/extensions.rst,
"Contexts").

Such a sandbox's kernels run ``SANDBOXD_KERNEL_PYTHON`` inside its own root: the template's
python, not the host's, so the host's probe (:func:`~sandboxd.core.contexts.languages.
probe_kernels`) says nothing of them. Its python is asked instead, as a command of the sandbox
(its uid, cgroup, namespaces and filter: a template's program never runs as the daemon), each
time a context is made there: a few tens of milliseconds beside a kernel's second, and what
the sandbox has installed into its own root since counts too.
"""

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sandboxd.core.contexts.languages import LANGUAGES, PROBE, Kernels
from sandboxd.core.exec.run import Exited
from sandboxd.core.exec.spec import ExecSpec
from sandboxd.core.sandbox import Sandbox

if TYPE_CHECKING:
    from sandboxd.core.contexts.service import ContextCommands

PROBE_TIMEOUT = 30.0
"""Seconds the template's python may take to answer (it imports nothing)."""
PROBE_OUTPUT = 4096
"""Bytes of the probe's output kept (its answer is one short line; an error's tail)."""
TEMPLATE_HINT = "build the template from the recipe 'code-interpreter'"
"""How a template gets what contexts need (docs/extensions.rst, "Built-in recipes")."""


async def kernels_of(commands: "ContextCommands", sandbox: Sandbox) -> Kernels:
    """The languages whose kernels ``sandbox`` can run: the host's for a sandbox on the
    host's root; for one made from a template, what its python says it has."""
    if sandbox.template is None:
        return await commands.kernels_probed()
    python = commands.config.kernel_python
    modules = sorted({need for lang in LANGUAGES.values() for need in lang.needs} - {"bash"})
    spec = ExecSpec((python, "-c", PROBE, *modules), {}, (), None, None, ())
    run = commands.start_in_sandbox(
        sandbox, spec, lambda _fd, _data: None, max_output=PROBE_OUTPUT, timeout=PROBE_TIMEOUT
    )
    outcome = await run.when_finished()
    where = f"{python} in template {sandbox.template.name!r}"
    if not isinstance(outcome, Exited) or outcome.code != 0:
        said = outcome.err if isinstance(outcome, Exited) else outcome.detail.encode()
        reason = f"{where} cannot run ({said.decode(errors='replace').strip()}): {TEMPLATE_HINT}"
        return Kernels((), dict.fromkeys(LANGUAGES, reason))
    return judged(where, parsed(outcome.out))


def parsed(out: bytes) -> Mapping[str, object]:
    """The probe's answer, a JSON object (``{}``: anything else, nothing found)."""
    try:
        found = json.loads(out)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def judged(where: str, found: Mapping[str, object]) -> Kernels:
    """The languages whose every need ``found`` (the probe's answer) says is there, and why
    each other one is missing (``where``: whose python was asked)."""
    languages: list[str] = []
    missing: dict[str, str] = {}
    for language in LANGUAGES.values():
        absent = [need for need in language.needs if found.get(need) is not True]
        if absent:
            missing[language.name] = f"{where} has no {', '.join(absent)}: {TEMPLATE_HINT}"
        else:
            languages.append(language.name)
    return Kernels(tuple(languages), missing)
