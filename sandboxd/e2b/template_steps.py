"""E2B's template build (``Template.build``) read as the core builder's Dockerfile
(docs/e2b.rst, "Building templates").

The SDK sends its template as ``{fromTemplate | fromImage, steps, startCmd?, readyCmd?,
force}``, each step ``{type, args, filesHash?, force}``. The base is a template of the
replica's store (``fromTemplate``, or a ``fromImage`` that names one, as the builder's ``FROM``
reads a name), or ``debian:<suite>`` (the builder's mmdebstrap); ``RUN`` runs as root,
``COPY`` takes the files the SDK uploaded for that step (its tar, under a directory of its own
in the build's context: :func:`assemble_context`), ``ENV`` and ``WORKDIR`` are the builder's.
What has no meaning here is refused naming the step (a registry image, a start command, a user
other than ``root`` or ``user``), or recorded where harmless (``readyCmd``, ``force``, a step's
``user``: every step runs as root, every file is root's).

Each Dockerfile step keeps the E2B step it comes from (``base`` for ``FROM``, else the step's
number from 1), which a failed build's reason names: the SDK finds the line of the caller's
program that added it from that.
"""

import fnmatch
import json
import posixpath
import re
import tarfile
from collections.abc import Callable
from typing import IO, Any

from attrs import frozen

from sandboxd.e2b.wire import RestError
from sandboxd.errors import BadArchive

BASE_STEP = "base"
"""The E2B name of the base's step (``FROM``)."""
USERS = ("", "root", "user")
"""The users a step may name: every step runs as root; ``user`` is each sandbox's own uid,
which a template cannot know (its files stay root's and readable)."""
FILES_HASH = re.compile(r"[0-9a-f]{64}\Z")
MODE = re.compile(r"[0-7]{3,4}\Z")
GLOB = re.compile(r"[*?\[]")


def _path(name: str) -> str:
    """A tar member's path as the builder reads it: below the root, ``.`` and empty
    components dropped (``BadArchive`` for ``..``)."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise BadArchive(f"member {name!r}: its path holds '..'")
    return "/".join(parts)


def _refuse(step: str, reason: str) -> RestError:
    where = "the template's base" if step == BASE_STEP else f"step {step}"
    return RestError(400, f"{where}: {reason}")


@frozen
class Copy:
    """A ``COPY`` of E2B step ``step``: the files of upload ``files_hash``, put in the context
    under ``prefix``; its source (a path or a glob pattern in the caller's context), its
    destination, and the mode its files get (``""``: as uploaded)."""

    step: str
    files_hash: str
    prefix: str
    source: str
    destination: str
    mode: str


@frozen
class Plan:
    """A build read: the base's ``FROM``, then each step as a Dockerfile instruction (a
    ``COPY`` as a :class:`Copy`, written once the context is assembled), with the E2B step of
    each; ``notes`` say what was recorded and not applied."""

    base: str
    steps: tuple[tuple[str, str | Copy], ...]
    notes: tuple[str, ...]

    @property
    def copies(self) -> list[Copy]:
        return [step for _, step in self.steps if isinstance(step, Copy)]

    def dockerfile(self, sources: dict[str, list[str]]) -> tuple[str, list[str]]:
        """The Dockerfile, its ``COPY`` sources those found in each upload (``sources`` by
        prefix), and the E2B step of each of its instructions."""
        lines, names = [f"FROM {self.base}"], [BASE_STEP]
        for name, step in self.steps:
            if not isinstance(step, Copy):
                lines.append(step)
                names.append(name)
                continue
            found = sources[step.prefix]
            destination = step.destination
            if len(found) > 1 or GLOB.search(step.source):
                destination = destination.rstrip("/") + "/"
            lines.append("COPY " + json.dumps([*found, destination]))
            names.append(name)
            if step.mode:
                for target in _copied(found, destination):
                    lines.append("RUN " + json.dumps(["chmod", step.mode, target]))
                    names.append(name)
        return "\n".join(lines) + "\n", names


def _copied(sources: list[str], destination: str) -> list[str]:
    """Where ``COPY sources destination`` puts each source (what a mode applies to)."""
    if not destination.endswith("/"):
        return [destination]
    return [destination + posixpath.basename(source) for source in sources]


def read_plan(body: dict[str, Any], is_template: Callable[[str], bool]) -> Plan:
    """The build the SDK's ``TemplateBuildStartV2`` body asks (``400`` naming the step that
    does not map); ``is_template`` says whether a name is a template of the store."""
    notes: list[str] = []
    base = _base(body, is_template)
    if body.get("startCmd") is not None:
        raise _refuse(
            "start command",
            "a start command (set_start_cmd) is not supported: a sandbox of sandboxd starts"
            " no process of its template; start it with commands.run(..., background=True)",
        )
    if body.get("readyCmd") is not None:
        notes.append("the ready command is not run: a sandboxd sandbox is ready once created")
    raw_steps = body.get("steps") or []
    if not isinstance(raw_steps, list):
        raise RestError(400, "steps: must be a list")
    steps: list[tuple[str, str | Copy]] = []
    for number, raw in enumerate(raw_steps, 1):
        name = str(number)
        if not isinstance(raw, dict):
            raise _refuse(name, "must be an object")
        args = raw.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise _refuse(name, "args: must be a list of strings")
        kind = raw.get("type")
        reader = READERS.get(kind) if isinstance(kind, str) else None
        if reader is None:
            raise _refuse(name, f"instruction {kind!r} is not supported ({', '.join(READERS)})")
        step = reader(name, args, raw)
        if step is not None:
            steps.append((name, step))
    return Plan(base, tuple(steps), tuple(notes))


def _base(body: dict[str, Any], is_template: Callable[[str], bool]) -> str:
    if body.get("fromImageRegistry") is not None:
        raise _refuse(BASE_STEP, "a registry's image is not supported: sandboxd pulls no image")
    template, image = body.get("fromTemplate"), body.get("fromImage")
    name = template if template is not None else image
    if not isinstance(name, str) or not name:
        raise _refuse(BASE_STEP, "fromTemplate or fromImage: must be a template's name")
    if is_template(name) or (image is not None and name.startswith("debian:")):
        return name
    if template is not None:
        raise RestError(404, f"the template's base: no template named {name!r}")
    raise _refuse(
        BASE_STEP,
        f"image {name!r} is no template of this sandboxd: it builds FROM its own templates"
        " (import the image as one first) or debian:<suite>, and pulls no image",
    )


def _user(step: str, user: str) -> None:
    if user.split(":", 1)[0] not in USERS:
        raise _refuse(
            step,
            f"user {user!r} is not available: steps run as root, and a sandbox runs as its"
            " own uid (user)",
        )


def _run(step: str, args: list[str], raw: dict[str, Any]) -> str:
    if not args or not args[0].strip():
        raise _refuse(step, "RUN needs a command")
    if len(args) > 1:
        _user(step, args[1])
    return "RUN " + json.dumps(["/bin/sh", "-c", args[0]])


def _copy(step: str, args: list[str], raw: dict[str, Any]) -> Copy:
    if len(args) < 2 or not args[0] or not args[1]:
        raise _refuse(step, "COPY needs a source and a destination")
    files_hash = raw.get("filesHash")
    if not isinstance(files_hash, str) or FILES_HASH.match(files_hash) is None:
        raise _refuse(step, "COPY needs its files' hash (filesHash)")
    source, destination = args[0], args[1]
    user = args[2] if len(args) > 2 else ""
    mode = args[3] if len(args) > 3 else ""
    _user(step, user)
    if mode and MODE.match(mode) is None:
        raise _refuse(step, f"mode {mode!r}: must be octal")
    if any(c.isspace() and c != " " for c in source + destination):
        raise _refuse(step, "COPY's paths may not hold a line break or a tab")
    return Copy(step, files_hash, f"e2b-copy-{step}", source, destination, mode)


def _env(step: str, args: list[str], raw: dict[str, Any]) -> str | None:
    if len(args) % 2:
        raise _refuse(step, "ENV needs pairs of a name and a value")
    pairs = []
    for key, value in zip(args[::2], args[1::2], strict=True):
        if not key or "=" in key or any(c.isspace() for c in key):
            raise _refuse(step, f"ENV: {key!r} is not a variable's name")
        if "\n" in value or "\r" in value:
            raise _refuse(step, f"ENV {key}: a value may not hold a line break")
        pairs.append(f"{key}={json.dumps(value)}")
    return "ENV " + " ".join(pairs) if pairs else None


def _workdir(step: str, args: list[str], raw: dict[str, Any]) -> str:
    if len(args) != 1 or not args[0] or any(c.isspace() for c in args[0]):
        raise _refuse(step, "WORKDIR takes one path, without spaces")
    return "WORKDIR " + args[0]


def _set_user(step: str, args: list[str], raw: dict[str, Any]) -> None:
    _user(step, args[0] if args else "?")


READERS: dict[str, Callable[[str, list[str], dict[str, Any]], str | Copy | None]] = {
    "RUN": _run,
    "COPY": _copy,
    "ENV": _env,
    "WORKDIR": _workdir,
    "USER": _set_user,
}


def assemble_context(
    target: IO[bytes], uploads: list[tuple[Copy, IO[bytes]]]
) -> dict[str, list[str]]:
    """Write the build's context tar to ``target`` (blocking: run in a thread): each upload's
    members under its copy's prefix, read and written a member at a time. Returns each copy's
    sources in the context: its source, or what its glob pattern matches (``BadArchive``
    naming the step when nothing does, or for a member whose path holds ``..``)."""
    sources: dict[str, list[str]] = {}
    with tarfile.open(fileobj=target, mode="w", format=tarfile.PAX_FORMAT) as out:
        for copy, upload in uploads:
            upload.seek(0)
            names = []
            try:
                with tarfile.open(fileobj=upload, mode="r:*") as tar:
                    for member in tar:
                        names.append(_add(out, tar, member, copy.prefix))
            except (tarfile.TarError, EOFError, OSError) as e:
                raise BadArchive(f"step {copy.step}: its files are not a tar: {e}") from None
            sources[copy.prefix] = _sources(copy, names)
    return sources


def _add(out: tarfile.TarFile, tar: tarfile.TarFile, member: tarfile.TarInfo, prefix: str) -> str:
    name = _path(member.name)
    data = tar.extractfile(member) if member.isreg() else None
    member.name = f"{prefix}/{name}" if name else prefix
    if member.islnk():
        member.linkname = f"{prefix}/{_path(member.linkname)}"
    member.pax_headers = {}
    out.addfile(member, data)
    return name


def _sources(copy: Copy, names: list[str]) -> list[str]:
    pattern = _path(copy.source)
    if GLOB.search(pattern) is None:
        found = [pattern]
    else:
        depth = pattern.count("/")
        found = sorted(
            n for n in names if n.count("/") == depth and fnmatch.fnmatchcase(n, pattern)
        )
        if not found:
            raise BadArchive(f"step {copy.step}: COPY {copy.source}: no file matches")
    return [f"{copy.prefix}/{name}" if name else copy.prefix for name in found]
