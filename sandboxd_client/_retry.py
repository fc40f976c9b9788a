"""
The retry policy for idempotent calls (docs/client.rst, "Errors and retries").

Only ``SandboxBusy`` (a timeout: the replica is reachable but slow) is retried, and only for
calls that are safe to repeat. Each attempt gets a longer read deadline and waits a longer
backoff before it, both growing geometrically up to a cap; after ``attempts`` tries the last
``SandboxBusy`` is raised. Sleeping uses the injected clock, never the global reactor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from attrs import frozen
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from ._types import SandboxBusy

T = TypeVar("T")


@frozen
class RetryPolicy:
    """
    Attempts, read deadlines and backoffs for idempotent calls.

    Attempt ``n`` (0-based) has read deadline ``min(timeout * timeout_growth**n, max_timeout)``
    and, for ``n > 0``, sleeps ``min(backoff * backoff_growth**(n-1), max_backoff)`` first.
    """

    attempts: int = 4
    timeout: float = 10.0
    timeout_growth: float = 2.0
    max_timeout: float = 60.0
    backoff: float = 0.5
    backoff_growth: float = 2.0
    max_backoff: float = 5.0

    def deadline(self, attempt: int) -> float:
        """Read deadline (seconds) of attempt number ``attempt`` (0-based)."""
        return float(min(self.timeout * self.timeout_growth**attempt, self.max_timeout))

    def delay(self, attempt: int) -> float:
        """Backoff (seconds) slept before attempt number ``attempt``; 0 for the first."""
        if attempt <= 0:
            return 0.0
        return float(min(self.backoff * self.backoff_growth ** (attempt - 1), self.max_backoff))


async def retrying(
    clock: IReactorTime,
    policy: RetryPolicy,
    attempt: Callable[[float], Awaitable[T]],
    *,
    gone_ok: type[BaseException] | None = None,
) -> T:
    """
    Run ``attempt(deadline)`` until it does not raise ``SandboxBusy``, at most
    ``policy.attempts`` times.

    ``gone_ok``: for removals (delete, rmdir, kill). If an earlier attempt timed out, the
    request may have been carried out before the reply was lost, so a later attempt failing with
    ``gone_ok`` counts as success and returns ``None``. On a first attempt it is raised.
    """
    busy: SandboxBusy | None = None
    for n in range(max(1, policy.attempts)):
        if n:
            await deferLater(clock, policy.delay(n), lambda: None)
        try:
            return await attempt(policy.deadline(n))
        except SandboxBusy as e:
            busy = e
        except BaseException as e:
            if busy is not None and gone_ok is not None and isinstance(e, gone_ok):
                return cast(T, None)
            raise
    assert busy is not None
    raise SandboxBusy(
        f"{busy.detail} (gave up after {max(1, policy.attempts)} attempts)",
        status=busy.status,
        error=busy.error,
    ) from busy
