"""Bridging ``async def`` implementations to the Deferred-returning public API."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from twisted.internet.defer import Deferred

P = ParamSpec("P")
R = TypeVar("R")


def async_to_deferred(f: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Deferred[R]]:
    """
    Wrap a coroutine function so that calling it returns a ``Deferred``.

    The coroutine starts running at once (up to its first ``await``); cancelling the Deferred
    raises ``CancelledError`` at the ``await`` it is waiting on.
    """

    @wraps(f)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Deferred[R]:
        return Deferred.fromCoroutine(f(*args, **kwargs))

    return wrapper
