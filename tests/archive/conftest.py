"""Fixtures of the archive tests (defined in ``archive_helpers``, with the helpers)."""

from tests.archive.archive_helpers import archive, pool, scratch, workspaces

__all__ = ["archive", "pool", "scratch", "workspaces"]
