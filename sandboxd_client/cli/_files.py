"""``sandboxctl put`` and ``get``: a file, a directory's whole tree, or a tar stream on
stdin/stdout (``-``), with a progress bar on a terminal."""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any

from .. import HttpSandbox
from .._types import SandboxHandle
from . import _trees
from ._console import Console, _transfer


async def _tree_capable(client: HttpSandbox, handle: SandboxHandle, dash: str | None) -> bool:
    """Whether the sandbox's replica takes trees as tar streams (``files.tree``); with
    ``dash`` (a ``-`` operand that needs them), ``ValueError`` saying so when it does not."""
    capable = _trees.TREE_CAPABILITY in await client.capabilities(handle)
    if not capable and dash is not None:
        raise ValueError(f"{dash}: this sandboxd has no tar streams (files.tree): upgrade it")
    return capable


async def _put(
    client: HttpSandbox, handle: SandboxHandle, args: argparse.Namespace, console: Console
) -> None:
    """A file; a directory's tree (one tar stream; per file on an older daemon); or, for
    ``-``, the tar stream on stdin (as ``docker cp - …``)."""
    remote = args.remote
    if args.local == "-":
        await _tree_capable(client, handle, "put -")
        await _transfer(console, remote, client.upload_tar, handle, remote, console.stdin)
    elif not os.path.isdir(args.local):
        await _transfer(console, remote, client.upload_file, handle, remote, args.local)
    elif await _tree_capable(client, handle, None):
        await _transfer(console, remote, client.upload_tree, handle, remote, args.local)
    else:
        put = functools.partial(_trees.put_tree, client, handle, args.local, remote)
        await _transfer(console, remote, put)


async def _get(
    client: HttpSandbox, handle: SandboxHandle, args: argparse.Namespace, console: Console
) -> None:
    """A file; a directory's tree (one tar stream; per file on an older daemon); or, for
    ``-``, the tree (or file) as a tar stream on stdout (as ``docker cp … -``)."""
    remote, local = args.remote, args.local
    if local == "-":
        await _tree_capable(client, handle, "get … -")
        await client.download_tar(handle, remote, console.out)
        return

    def one_file() -> Any:
        return _transfer(console, remote, client.download_to_file, handle, remote, local)

    if await client.size(handle, remote) is not None:
        await one_file()
    elif await _tree_capable(client, handle, None):
        await _transfer(console, remote, client.download_tree, handle, remote, local)
    else:
        get = functools.partial(
            _trees.get_tree, client, handle, remote, local, download_file=one_file
        )
        await _transfer(console, remote, get)
