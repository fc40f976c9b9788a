"""Blocks of sandbox uids, one per daemon a test run starts as root, so that no two of its
daemons (nor, most likely, two concurrent runs: the base is random) hand out the same uid."""

import random

UID_BLOCK = 8
"""uids of a kernel daemon's block (its sandboxes live a few at a time)."""
UNISOLATED_BLOCK = 512
"""uids of an ``--isolation=none`` daemon's block (some of them hold many sandboxes at once)."""
UID_RANGE = 2_000_000
"""uids one run shares out."""
_UID_BASE = 600_000 + random.randrange(500) * UID_RANGE
_next = [_UID_BASE]


def uid_block(size: int = UID_BLOCK) -> tuple[int, int]:
    """A block of ``size`` uids no other daemon of this run (or, most likely, of a concurrent
    run: the base is random) gets."""
    low = _next[0]
    _next[0] += size
    assert _next[0] <= _UID_BASE + UID_RANGE, "more daemons than uids: widen the per-run range"
    return low, low + size - 1
