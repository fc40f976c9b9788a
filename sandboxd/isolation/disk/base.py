"""What the layout asks of a disk driver, and what a driver reports."""

from collections.abc import Callable
from typing import Protocol, TypeVar

from attrs import frozen

from sandboxd.isolation.base import Identity, IsolationUnavailable


class DiskUnavailable(IsolationUnavailable):
    """A disk limit is configured and the state root's filesystem cannot enforce it."""


@frozen
class DiskLimits:
    """The configured per-sandbox limits (``None``: no limit)."""

    bytes: int | None
    files: int | None

    @property
    def any(self) -> bool:
        return self.bytes is not None or self.files is not None


@frozen
class DiskUsage:
    """A sandbox's usage and limits as the kernel counts them (``None``: not counted)."""

    bytes: int | None
    bytes_limit: int | None
    files: int | None
    files_limit: int | None


NO_USAGE = DiskUsage(None, None, None, None)

T = TypeVar("T")

RemoveTree = Callable[[str], None]
"""Removes a directory and everything in it, best effort (``workspace.remove_tree``)."""


class DiskDriver(Protocol):
    """Makes and removes each sandbox's top directory ``{root}/{rid}`` under its limits."""

    @property
    def name(self) -> str:
        """``btrfs``, ``ext4``, ``xfs`` or ``none`` (for the start-up log)."""

    @property
    def enforcing(self) -> bool:
        """Whether limits are in force (``isolation.disk`` in ``/healthz``)."""

    def make_directory(self, path: str, identity: Identity) -> None:
        """Create ``path`` (mode 0700 before the layout's chmod) under the sandbox's limits."""

    def usage(self, path: str) -> DiskUsage:
        """The sandbox's usage and limits (``NO_USAGE`` when nothing is counted)."""

    def destroy(self, path: str, remove_tree: RemoveTree) -> None:
        """Remove ``path``, everything in it and its quota; a missing path is fine."""

    def sweep(self, live: Callable[[str], bool]) -> int:
        """Remove quota objects a crashed predecessor left without a directory; ``live(path)``
        says whether a sandbox directory still exists. Returns how many were removed."""

    def charged(self, work: Callable[[], T]) -> Callable[[], T]:
        """``work`` (a sandbox's file work, in a thread with its fs credentials) made subject
        to the sandbox's limits where the daemon's privilege would exempt it."""
