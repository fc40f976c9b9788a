"""The sandbox uid/gid pool: bare numbers from ``[uid_min, uid_max]``, one per live sandbox.

A sandbox's gid is its uid. Identities are handed out first-in first-out: a released uid goes to
the back of the queue, so the uid of a sandbox killed a moment ago is the last one reused, and
whatever it may have left behind (a stray file in a shared place, a process a kill missed) is
least likely to meet a new sandbox.
"""

from collections import deque

from sandboxd.isolation.base import Identity, NoFreeUid


class NumericUidPool:
    """Every uid of ``[uid_min, uid_max]``; allocate and release are O(1)."""

    def __init__(self, uid_min: int, uid_max: int) -> None:
        """Raise ``ValueError`` for an empty range or one that includes uid 0 (root)."""
        if uid_min < 1:
            raise ValueError(f"uid_min {uid_min} must be above 0 (uid 0 is root)")
        if uid_max < uid_min:
            raise ValueError(f"uid_max {uid_max} is below uid_min {uid_min}")
        self.uid_min = uid_min
        self.uid_max = uid_max
        self._queue: deque[int] = deque(range(uid_min, uid_max + 1))
        self._live: set[int] = set()

    @property
    def total(self) -> int:
        """How many identities the pool holds in all."""
        return self.uid_max - self.uid_min + 1

    @property
    def free(self) -> int:
        """How many identities can be allocated now."""
        return len(self._queue)

    def allocate(self) -> Identity:
        """The free uid released longest ago (gid = uid); :class:`NoFreeUid` when none is left."""
        if not self._queue:
            raise NoFreeUid(f"all {self.total} sandbox uids ({self.uid_min}-{self.uid_max}) in use")
        uid = self._queue.popleft()
        self._live.add(uid)
        return Identity(uid, uid)

    def release(self, identity: Identity) -> None:
        """Put ``identity`` at the back of the free queue; releasing a free uid is a no-op."""
        uid = identity.uid
        if uid in self._live:
            self._live.remove(uid)
            self._queue.append(uid)
