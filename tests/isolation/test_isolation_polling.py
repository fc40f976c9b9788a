"""Polling on the reactor clock with growing delays."""

import itertools

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from sandboxd.isolation.cgroups.polling import MAX_DELAY, wait_until
from tests.support.kernel_fakes import settle


def test_true_at_once_needs_no_time() -> None:
    clock = Clock()
    d = Deferred.fromCoroutine(wait_until(clock, lambda: True, 1.0))
    assert settle(clock, d) is True
    assert clock.seconds() == 0


def test_polls_with_growing_delays_and_retries_between_checks() -> None:
    clock = Clock()
    checks: list[float] = []
    retries: list[float] = []

    def done() -> bool:
        checks.append(clock.seconds())
        return len(checks) == 8

    d = Deferred.fromCoroutine(wait_until(clock, done, 5.0, lambda: retries.append(1)))
    assert settle(clock, d, step=0.0005) is True
    gaps = [round(b - a, 4) for a, b in itertools.pairwise(checks)]
    assert gaps[:4] == [0.001, 0.002, 0.004, 0.008]
    assert max(gaps) <= MAX_DELAY + 0.001
    assert len(retries) == 7


def test_gives_up_after_the_timeout() -> None:
    clock = Clock()
    d = Deferred.fromCoroutine(wait_until(clock, lambda: False, 0.5))
    assert settle(clock, d) is False
    assert 0.5 <= clock.seconds() < 0.5 + MAX_DELAY + 0.02
