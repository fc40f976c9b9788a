"""The ``sandboxctl`` command line: options and sub-commands (argparse alone, so that
``sandboxctl --help`` and a usage error never import Twisted)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ._templates import add_parsers as add_template_parsers

DEFAULT_URL = "http://127.0.0.1:8080"

COMMAND_TAKERS = ("exec", "run")
"""Sub-commands whose first word after the handle starts the command: ``exec H ls -la``."""

VALUED_OPTIONS = frozenset(
    ("--url", "--token-file", "--cacert", "--env", "--cwd", "--timeout", "--tag")
)
"""The options of ``exec``/``run`` (and the global ones) that take a value; the others are
flags (``-i``, ``-d``, ``--json``)."""


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _rule(text: str) -> tuple[str, str, str]:
    """``HOST:HEADER=VALUE`` (the error never repeats the text: it may hold a secret)."""
    host, colon, rest = text.partition(":")
    header, equals, value = rest.partition("=")
    if not (host and colon and header and equals):
        raise argparse.ArgumentTypeError("expected HOST:HEADER=VALUE")
    return host, header, value


def _add_socks5_options(p: argparse.ArgumentParser) -> None:
    """``create``'s own SOCKS5 proxy: the password only from the environment or a file."""
    p.add_argument(
        "--socks5",
        metavar="ADDRESS:PORT",
        help="egress: all its TCP leaves through this SOCKS5 proxy (an IP address and a port)",
    )
    p.add_argument("--socks5-user", metavar="NAME", help="egress: the SOCKS5 proxy's user name")
    secret = p.add_mutually_exclusive_group()
    secret.add_argument(
        "--socks5-password-env",
        metavar="VARIABLE",
        help="egress: the SOCKS5 proxy's password, read from the environment variable VARIABLE",
    )
    secret.add_argument(
        "--socks5-password-file",
        metavar="FILE",
        help="egress: the SOCKS5 proxy's password, the first line of FILE",
    )
    p.add_argument("--socks5-tls", action="store_true", help="egress: TLS to the SOCKS5 proxy")
    p.add_argument(
        "--socks5-tls-server-name",
        metavar="NAME",
        help="egress: the name the SOCKS5 proxy's certificate is verified for (implies TLS)",
    )
    p.add_argument(
        "--socks5-ca-file",
        metavar="FILE",
        help="egress: PEM certificates the SOCKS5 proxy's must chain to (implies TLS)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; global options are accepted before or after the subcommand."""
    parser = argparse.ArgumentParser(
        prog="sandboxctl",
        description="Drive a sandboxd service. HANDLE is what create prints, or an id that "
        "list prints (on the service of --url).",
    )
    common = argparse.ArgumentParser(add_help=False)
    for p, default in ((parser, True), (common, False)):

        def d(value: Any, default: bool = default) -> Any:
            return value if default else argparse.SUPPRESS

        p.add_argument("--url", default=d(os.environ.get("SANDBOXD_URL", DEFAULT_URL)))
        p.add_argument("--token-file", default=d(os.environ.get("SANDBOXD_TOKEN_FILE")))
        p.add_argument(
            "--cacert",
            default=d(os.environ.get("SANDBOXD_CA_FILE")),
            help="PEM file of the CA to trust for an https URL (default: $SANDBOXD_CA_FILE)",
        )
        p.add_argument("--json", action="store_true", default=d(False), help="JSON output")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    p = add("create", "create a sandbox and print its handle")
    p.add_argument("--image")
    p.add_argument("--env", type=_env_pair, action="append", default=[])
    p.add_argument("--port", type=int, action="append", default=[])
    p.add_argument("--item-id")
    p.add_argument("--network", choices=("none", "egress", "host"))
    p.add_argument(
        "--allow",
        action="append",
        help="egress: an address, CIDR or host name (*.example.com) it may reach"
        " (repeatable; none: all the host permits)",
    )
    p.add_argument(
        "--deny",
        action="append",
        default=[],
        help="egress: an address, CIDR or host name it may not reach",
    )
    p.add_argument(
        "--rule",
        type=_rule,
        action="append",
        default=[],
        metavar="HOST:HEADER=VALUE",
        help="egress: a header set on its plain HTTP requests to HOST (repeatable; the value"
        " lands in the shell's history: see --rule-env, --rules-file)",
    )
    p.add_argument(
        "--rule-env",
        type=_rule,
        action="append",
        default=[],
        metavar="HOST:HEADER=VARIABLE",
        help="egress: as --rule, the value read from the environment variable VARIABLE",
    )
    p.add_argument(
        "--rules-file",
        metavar="FILE",
        help='egress: header rules from a JSON file, {"HOST": {"HEADER": "VALUE"}}',
    )
    _add_socks5_options(p)
    p.add_argument("--template", help="a template of the replica, as the sandbox's root")
    add("kill", "kill a sandbox").add_argument("handle")
    add("fork", "copy a sandbox's files into a new one and print its handle").add_argument("handle")
    p = add("exec", "run a command: its stdout to stdout, its stderr to stderr")
    p.add_argument("handle")
    p.add_argument("--env", type=_env_pair, action="append", default=[])
    p.add_argument("--cwd", help="working directory, relative to the workspace (default: its top)")
    p.add_argument("--timeout", type=float)
    p.add_argument(
        "-i",
        "--stdin",
        action="store_true",
        help="stream this process's stdin (implied when it is a pipe or a file)",
    )
    p.add_argument("-t", "--tty", action="store_true", help="a terminal: not yet (exits 2)")
    p.add_argument("cmd", nargs="*", help="the command; options after it are its own")
    p = add("put", "upload a local file or directory (recursive)")
    p.add_argument("handle")
    p.add_argument("local")
    p.add_argument("remote")
    p = add("get", "download a file or directory (recursive)")
    p.add_argument("handle")
    p.add_argument("remote")
    p.add_argument("local")
    p = add("ls", "list files under ROOT")
    p.add_argument("handle")
    p.add_argument("root", nargs="?", default="/")
    p = add("rm", "delete a file (or, with -r, a directory)")
    p.add_argument("handle")
    p.add_argument("path")
    p.add_argument("-r", "--recursive", action="store_true")
    _add_process_parsers(add)
    add_template_parsers(add, common)
    _add_code_parser(add)
    add("list", "list live sandboxes").add_argument("--pod")
    add("health", "show service health").add_argument("--pod")
    p = add("mcp", "serve the sandboxes to an MCP client (stdio, or streamable HTTP)")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: the address to listen on")
    p.add_argument("--port", type=int, default=8765, help="http: the port to listen on")
    p.add_argument("--path", default="/mcp", help="http: the endpoint's path")
    p.add_argument(
        "--max-output", type=int, default=64 << 10, help="bytes of stdout/stderr per result"
    )
    return parser


def _add_process_parsers(add: Any) -> None:
    """Background processes and workspace watch (run by ``_processes``)."""
    p = add("run", "start a command in the background (-d)")
    p.add_argument("-d", "--detach", action="store_true", required=True)
    p.add_argument("handle")
    p.add_argument("--env", type=_env_pair, action="append", default=[])
    p.add_argument("--cwd")
    p.add_argument("--timeout", type=float)
    p.add_argument("--tag")
    p.add_argument("-i", "--stdin", action="store_true", help="keep a stdin pipe open")
    p.add_argument("cmd", nargs="*", help="the command; options after it are its own")
    p = add("logs", "print a background process's output")
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--offset", type=int, default=0, help="the byte offset to start at")
    p.add_argument("handle")
    p.add_argument("id")
    add("ps", "list background processes").add_argument("handle")
    p = add("signal", "send a signal to a background process's group")
    p.add_argument("handle")
    p.add_argument("id")
    p.add_argument("signal")
    p = add("shell", "an interactive terminal in the sandbox (as docker exec -it)")
    p.add_argument("handle")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (sh when none)")
    p = add("watch", "print each change under ROOT")
    p.add_argument("handle")
    p.add_argument("root", nargs="?", default="/")
    p.add_argument("--flat", action="store_true", help="ROOT only, not its subdirectories")


def _add_code_parser(add: Any) -> None:
    """``run-code`` (run by ``_code``)."""
    p = add("run-code", "run Python code in the sandbox's interpreter (state kept)")
    p.add_argument("handle")
    p.add_argument("code", nargs="?", help="the code (default: all of stdin)")
    p.add_argument("--context", help="a context id (default: the sandbox's first Python one)")
    p.add_argument("--timeout", type=float, help="seconds before the cell is interrupted")


def _command_start(argv: list[str]) -> int | None:
    """Where the command of ``exec``/``run`` begins in ``argv``: the first word after the
    handle that is not one of the sub-command's options (``None``: no command there)."""
    command: str | None = None
    positionals = 0
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return None  # the separator: parse_args takes it from here
        if command is not None and word.startswith("-") and word != "-":
            i += 2 if word in VALUED_OPTIONS else 1  # --cwd=d is one word
            continue
        if command is None:
            if word in COMMAND_TAKERS:
                command = word
            elif not word.startswith("-"):
                return None  # another sub-command
            elif word in ("--url", "--token-file"):
                i += 1
            i += 1
            continue
        positionals += 1
        if positionals == 2:  # the handle, then the command
            return i
        i += 1
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """
    Parse a command line. For ``exec`` and ``run`` the command starts at the first word after
    the handle that is not one of their options, and everything from there is the command
    verbatim (``exec H ls -la``); ``--`` marks the start explicitly (``exec H -- -x``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    start = _command_start(argv)
    if start is not None:
        args = parser.parse_args(argv[:start])
        args.cmd = argv[start:]
        return args
    if "--" in argv and _sub_command(argv) in COMMAND_TAKERS:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        args.cmd = [*args.cmd, *argv[cut + 1 :]]
        return args
    return parser.parse_args(argv)  # another command's -- is argparse's: the end of options


def _sub_command(argv: list[str]) -> str | None:
    """The sub-command word of ``argv``: the first that is neither a global option nor the
    value of one (``None``: there is none)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            return word
        i += 2 if word in ("--url", "--token-file") else 1
    return None
