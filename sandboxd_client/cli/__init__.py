"""
``sandboxctl``: the sandboxd client at a terminal (SPEC §6).

``main`` is the console script; ``main_async`` runs one command line on a running reactor
(for embedding and tests), writing to a ``Console``. The commands themselves are in
``_commands``.
"""

from ._commands import Console, build_parser, main, main_async, parse_args, run

__all__ = ["Console", "build_parser", "main", "main_async", "parse_args", "run"]
