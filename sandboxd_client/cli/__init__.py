"""
``sandboxctl``: the sandboxd client at a terminal (docs/client.rst, "sandboxctl").

``main`` is the console script; ``main_async`` runs one command line on a running reactor
(for embedding and tests), writing to a ``Console``. The commands themselves are in
``_commands``, imported only once the command line has been parsed: ``sandboxctl --help``
and a usage error never import Twisted.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, NoReturn

from ._parser import build_parser, parse_args

if TYPE_CHECKING:
    from ._commands import Console, main_async, run

__all__ = ["Console", "build_parser", "main", "main_async", "parse_args", "run"]

_LAZY = ("Console", "main_async", "run")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("._commands", __name__), name)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point: parse ``argv`` (default ``sys.argv[1:]``) and exit."""
    args = parse_args(argv)  # --help and usage errors end here
    from ._commands import main_parsed

    main_parsed(args, argv)
