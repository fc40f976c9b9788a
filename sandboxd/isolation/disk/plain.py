"""No disk limits: a sandbox's top directory is a plain directory (the default)."""

import os
from collections.abc import Callable
from typing import TypeVar

from attrs import frozen

from sandboxd.isolation.base import Identity
from sandboxd.isolation.disk.base import NO_USAGE, DiskUsage, RemoveTree

T = TypeVar("T")


@frozen
class NoDiskLimits:
    """Plain directories, nothing counted: sandboxes share the state root's free space."""

    name: str = "none"

    def charged(self, work: Callable[[], T]) -> Callable[[], T]:
        """The limits hold for the daemon's own writes too: ``work`` as it is."""
        return work

    @property
    def enforcing(self) -> bool:
        return False

    def make_directory(self, path: str, identity: Identity) -> None:
        os.mkdir(path, 0o700)

    def usage(self, path: str) -> DiskUsage:
        return NO_USAGE

    def destroy(self, path: str, remove_tree: RemoveTree) -> None:
        remove_tree(path)

    def sweep(self, live: Callable[[str], bool]) -> int:
        return 0
