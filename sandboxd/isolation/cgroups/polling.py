"""Waiting for the kernel: poll a condition on the reactor's clock, never blocking it."""

from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

FIRST_DELAY = 0.001
MAX_DELAY = 0.05


class StillPopulated(Exception):
    """A cgroup kept processes after every kill sweep and the whole grace period."""


async def wait_until(
    clock: IReactorTime,
    done: Callable[[], bool],
    timeout: float,
    retry: Callable[[], object] | None = None,
) -> bool:
    """Whether ``done()`` came true within ``timeout`` seconds of ``clock``.

    Checks at once, then after delays growing from 1 ms to 50 ms; ``retry()`` runs before each
    later check (another kill sweep, say).
    """
    deadline = clock.seconds() + timeout
    delay = FIRST_DELAY
    while not done():
        if clock.seconds() >= deadline:
            return False
        await deferLater(clock, delay)
        delay = min(delay * 2, MAX_DELAY)
        if retry is not None:
            retry()
    return True
