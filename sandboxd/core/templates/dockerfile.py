"""The Dockerfile subset a template build reads (docs/extensions.rst, "Building a template").

``FROM`` (once, first), ``RUN``, ``COPY``, ``ENV`` and ``WORKDIR``; comments (``#``), blank
lines and lines continued with a final ``\\``. Any other instruction is refused by name with
its line (``BadRequest``), before anything is built.
"""

import json
import shlex

from attrs import frozen

from sandboxd.errors import BadRequest

SUPPORTED = ("FROM", "RUN", "COPY", "ENV", "WORKDIR")


@frozen
class Step:
    """One instruction: its name, its arguments as written, and the line it starts on."""

    instruction: str
    arguments: str
    line: int

    @property
    def text(self) -> str:
        return f"{self.instruction} {self.arguments}"


def _refuse(line: int, reason: str) -> BadRequest:
    return BadRequest(f"Dockerfile line {line}: {reason}")


def parse_dockerfile(text: str) -> list[Step]:
    """The steps of ``text``, the first a ``FROM`` and no other; ``BadRequest`` naming the
    line of the first instruction that is not supported or not well formed."""
    steps: list[Step] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # inside a continued instruction too, as Docker reads it
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        steps.append(_step(" ".join(part for part in pending if part), start))
        pending = []
    if pending:
        steps.append(_step(" ".join(part for part in pending if part), start))
    if not steps or steps[0].instruction != "FROM":
        raise BadRequest("Dockerfile: the first instruction must be FROM")
    for step in steps[1:]:
        if step.instruction == "FROM":
            raise _refuse(step.line, "only one FROM is supported (no multi-stage builds)")
    return steps


def _step(logical: str, line: int) -> Step:
    instruction, _, arguments = logical.partition(" ")
    instruction = instruction.upper()
    arguments = arguments.strip()
    if instruction not in SUPPORTED:
        raise _refuse(
            line, f"instruction {instruction} is not supported (only {', '.join(SUPPORTED)})"
        )
    if not arguments:
        raise _refuse(line, f"{instruction} needs arguments")
    step = Step(instruction, arguments, line)
    CHECKS[instruction](step)
    return step


def from_name(step: Step) -> str:
    """``FROM``'s image: a template's name, or ``debian:<suite>`` (``AS`` and flags refused)."""
    words = step.arguments.split()
    if len(words) != 1 or words[0].startswith("-"):
        raise _refuse(step.line, "FROM takes one name (no flags, no AS)")
    return words[0]


def run_argv(step: Step) -> list[str]:
    """``RUN``'s command: the exec form (a JSON array of strings) as it is, the shell form
    through ``/bin/sh -c``."""
    if step.arguments.startswith("["):
        try:
            argv = json.loads(step.arguments)
        except ValueError:
            argv = None
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise _refuse(step.line, "RUN's exec form must be a JSON array of strings")
        return argv
    if step.arguments.startswith("--"):
        raise _refuse(step.line, "RUN takes no flags")
    return ["/bin/sh", "-c", step.arguments]


def copy_paths(step: Step) -> tuple[list[str], str]:
    """``COPY``'s sources (paths in the context) and destination (flags refused)."""
    if step.arguments.startswith("["):
        try:
            words = json.loads(step.arguments)
        except ValueError:
            words = None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise _refuse(step.line, "COPY's JSON form must be an array of strings")
    else:
        words = step.arguments.split()
    if any(word.startswith("--") for word in words):
        raise _refuse(step.line, "COPY takes no flags (--from, --chown, ... are not supported)")
    if len(words) < 2:
        raise _refuse(step.line, "COPY needs a source and a destination")
    return words[:-1], words[-1]


def env_pairs(step: Step) -> list[tuple[str, str]]:
    """``ENV``'s variables: ``KEY=value ...`` (shell quoting) or the old ``KEY value``."""
    try:
        words = shlex.split(step.arguments)
    except ValueError as e:
        raise _refuse(step.line, f"ENV: {e}") from None
    if "=" not in words[0]:
        if len(words) < 2:
            raise _refuse(step.line, "ENV needs KEY=value or KEY value")
        key, value = step.arguments.split(None, 1)
        return [(key, value)]
    pairs = []
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise _refuse(step.line, f"ENV: {word!r} is not KEY=value")
        pairs.append((key, value))
    return pairs


def workdir_path(step: Step) -> str:
    """``WORKDIR``'s directory (one word)."""
    words = step.arguments.split()
    if len(words) != 1:
        raise _refuse(step.line, "WORKDIR takes one path")
    return words[0]


CHECKS = {
    "FROM": from_name,
    "RUN": run_argv,
    "COPY": copy_paths,
    "ENV": env_pairs,
    "WORKDIR": workdir_path,
}
"""Each instruction's reading of its arguments, done at parse time so that a malformed one is
refused before the build begins."""
