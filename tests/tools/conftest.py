"""Fixtures of the tool tests (defined in ``tools_helpers``, with the artifact store)."""

from tests.tools.tools_helpers import http, make_resolver, pool, resolver, scratch, server

__all__ = ["http", "make_resolver", "pool", "resolver", "scratch", "server"]
