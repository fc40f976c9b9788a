"""The uid pool: bare numbers, never 0, never shared, released uids reused last."""

import pytest

from sandboxd.isolation.base import Identity, NoFreeUid
from sandboxd.isolation.uids import NumericUidPool


def test_allocates_every_uid_once_with_gid_equal_to_uid() -> None:
    pool = NumericUidPool(200000, 200002)
    got = [pool.allocate() for _ in range(3)]
    assert got == [Identity(200000, 200000), Identity(200001, 200001), Identity(200002, 200002)]
    assert (pool.total, pool.free) == (3, 0)
    with pytest.raises(NoFreeUid, match="all 3 sandbox uids"):
        pool.allocate()


def test_released_uid_goes_to_the_back_of_the_queue() -> None:
    pool = NumericUidPool(10, 12)
    first = pool.allocate()
    pool.release(first)
    assert pool.free == 3
    assert [pool.allocate().uid for _ in range(3)] == [11, 12, 10]


def test_release_is_idempotent_and_ignores_strangers() -> None:
    pool = NumericUidPool(10, 11)
    one = pool.allocate()
    pool.release(one)
    pool.release(one)
    pool.release(Identity(99, 99))
    assert pool.free == 2
    assert {pool.allocate().uid, pool.allocate().uid} == {10, 11}


@pytest.mark.parametrize(("low", "high"), [(0, 10), (-5, 10), (10, 9)])
def test_refuses_root_and_empty_ranges(low: int, high: int) -> None:
    with pytest.raises(ValueError):
        NumericUidPool(low, high)
