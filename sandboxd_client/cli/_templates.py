"""``sandboxctl template``: the templates of a replica (docs/extensions.rst, "Templates").

template import NAME FILE [--pod URL]   import an archive (a rootfs tarball, an OCI image
                                        layout in a tar, or a ``docker save`` archive)
template build NAME DIR [--pod URL] [--network host]
                                        build from DIR's Dockerfile, printing each step,
                                        its output, then the template
template build NAME --recipe R [--pod URL]
                                        build a recipe of the replica's (code-interpreter:
                                        python3, ipykernel, numpy, pandas, matplotlib)
template ls [--pod URL]                 the replica's templates
template rm NAME [--pod URL]            delete a template

Templates belong to one replica: ``--pod`` names it (default: the one ``--url`` reaches).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .. import HttpSandbox
    from .._types import TemplateInfo

COMMANDS = ("template",)


def add_parsers(add: Any, common: argparse.ArgumentParser) -> None:
    """``template`` and its own sub-commands."""
    template = add("template", "import, build, list and delete a replica's templates")
    sub = template.add_subparsers(dest="template_command", required=True)
    p = sub.add_parser("import", help="import an archive as a template", parents=[common])
    p.add_argument("name")
    p.add_argument("file", help="a rootfs tarball, an OCI archive or a docker save archive")
    p.add_argument("--pod", help="the replica to import on (default: the one --url reaches)")
    p = sub.add_parser("build", help="build a template from a Dockerfile", parents=[common])
    p.add_argument("name")
    p.add_argument("dir", nargs="?", help="the build's context: its Dockerfile at the top")
    p.add_argument("--recipe", help="a built-in recipe of the replica instead of DIR")
    p.add_argument("--pod", help="the replica to build on (default: the one --url reaches)")
    p.add_argument("--network", choices=("none", "host"), help="RUN's network (default none)")
    p = sub.add_parser("ls", help="list the templates", parents=[common])
    p.add_argument("--pod")
    p = sub.add_parser("rm", help="delete a template", parents=[common])
    p.add_argument("name")
    p.add_argument("--pod")


def progress_line(frame: dict[str, Any]) -> str | None:
    """One build frame as ``build`` prints it: a step's start, an output line indented (the
    end is printed by the caller)."""
    if "instruction" in frame and "end" not in frame:
        return f"Step {frame['step']}/{frame['steps']} (line {frame['line']}): " + str(
            frame["instruction"]
        )
    if "output" in frame:
        return f"  {frame['output']}"
    return None


def line(template: TemplateInfo, now: float) -> str:
    """One template as ``ls`` prints it: name, size, digest (short), age."""
    age = max(0, int(now - template.created))
    return f"{template.name}  {template.size:>12}  {template.digest[:19]}  {age}s ago"


async def run(client: HttpSandbox, args: argparse.Namespace, console: Any) -> int:
    """Carry out one ``template`` sub-command; return the exit code."""
    from attrs import asdict  # not at the top: ``sandboxctl --help`` imports no attrs

    if args.template_command == "import":
        from ._console import _transfer

        label = f"template {args.name}"
        send = functools.partial(client.import_template, pod_url=args.pod)
        imported = await _transfer(console, label, send, args.name, args.file)
        if args.json:
            console.json(asdict(imported))
        else:
            console.print(line(imported, time.time()))
        return 0
    if args.template_command == "build":

        def show(frame: dict[str, Any]) -> None:
            text = json.dumps(frame, sort_keys=True) if args.json else progress_line(frame)
            if text is not None:
                console.print(text)

        if (args.dir is None) == (args.recipe is None):
            console.error("template build: give DIR or --recipe, one of them")
            return 2
        if args.recipe is not None:
            build = functools.partial(client.build_recipe, args.name, args.recipe)
        else:
            build = functools.partial(client.build_template, args.name, args.dir)
        built = await build(pod_url=args.pod, network=args.network, on_frame=show)
        if not args.json:
            console.print(line(built, time.time()))
        return 0
    if args.template_command == "ls":
        templates = await client.list_templates(args.pod)
        if args.json:
            console.json([asdict(t) for t in templates])
        elif not templates:
            console.note(f"no templates on {args.pod or args.url}")
        now = time.time()
        for template in [] if args.json else templates:
            console.print(line(template, now))
        return 0
    await client.delete_template(args.name, args.pod)  # rm
    if args.json:
        console.json({"ok": True})
    return 0
