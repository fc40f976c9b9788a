"""Filesystem credentials per call: switch, verify, run, always switch back."""

from collections.abc import Callable
from typing import Any

import pytest
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from sandboxd.isolation.base import Identity
from sandboxd.isolation.fscreds import (
    FsCredentialsError,
    FsCredentialThreads,
    LibcFsIds,
    call_as,
    drop_supplementary_groups,
)

SANDBOX = Identity(200123, 200123)


class FakeIds:
    """The two libc calls, with the kernel's "return the old value" and refusal behaviour."""

    def __init__(self, refuse_uid: set[int] | None = None, refuse_gid: set[int] | None = None):
        self.fsuid = 0
        self.fsgid = 0
        self.refuse_uid = refuse_uid or set()
        self.refuse_gid = refuse_gid or set()
        self.calls: list[tuple[str, int]] = []

    def setfsuid(self, uid: int) -> int:
        self.calls.append(("uid", uid))
        old = self.fsuid
        if uid != -1 and uid not in self.refuse_uid:
            self.fsuid = uid
        return old

    def setfsgid(self, gid: int) -> int:
        self.calls.append(("gid", gid))
        old = self.fsgid
        if gid != -1 and gid not in self.refuse_gid:
            self.fsgid = gid
        return old


def test_work_runs_with_the_identity_and_root_is_restored() -> None:
    ids = FakeIds()
    seen = call_as(ids, SANDBOX, Identity(0, 0), lambda: (ids.fsuid, ids.fsgid))
    assert seen == (SANDBOX.uid, SANDBOX.gid)
    assert (ids.fsuid, ids.fsgid) == (0, 0)
    assert ids.calls[:4] == [("gid", 200123), ("gid", -1), ("uid", 200123), ("uid", -1)]


def test_restored_even_when_the_work_fails() -> None:
    ids = FakeIds()

    def boom() -> None:
        raise PermissionError("denied")

    with pytest.raises(PermissionError):
        call_as(ids, SANDBOX, Identity(0, 0), boom)
    assert (ids.fsuid, ids.fsgid) == (0, 0)


@pytest.mark.parametrize("refused", ["uid", "gid"])
def test_a_refused_switch_never_runs_the_work(refused: str) -> None:
    ids = FakeIds(**{f"refuse_{refused}": {SANDBOX.uid}})
    ran: list[int] = []
    with pytest.raises(FsCredentialsError, match=f"setfs{refused}"):
        call_as(ids, SANDBOX, Identity(0, 0), lambda: ran.append(1))
    assert ran == []
    assert (ids.fsuid, ids.fsgid) == (0, 0)


def test_a_refused_restore_is_an_error() -> None:
    ids = FakeIds(refuse_uid={0})
    with pytest.raises(FsCredentialsError, match="could not restore"):
        call_as(ids, SANDBOX, Identity(0, 0), lambda: None)


class ImmediateReactor:
    def callFromThread(self, f: Callable[..., Any], *args: Any, **kw: Any) -> None:
        f(*args, **kw)


class InlinePool:
    """A ThreadPool stand-in running each call at once, in the calling thread."""

    started = False

    def callInThreadWithCallback(
        self, on_result: Callable[[bool, Any], None], f: Callable[..., Any], *args: Any
    ) -> None:
        try:
            result = f(*args)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.started = False


def make(ids: FakeIds) -> tuple[FsCredentialThreads, InlinePool]:
    pool = InlinePool()
    return FsCredentialThreads(ImmediateReactor(), pool, ids), pool  # type: ignore[arg-type]


def test_run_fires_with_the_result_of_the_work() -> None:
    ids = FakeIds()
    fs, _ = make(ids)
    results: list[object] = []
    fs.run(SANDBOX, lambda: ids.fsuid).addBoth(results.append)
    assert results == [SANDBOX.uid]


def test_run_fires_with_the_failure_of_the_work() -> None:
    fs, _ = make(FakeIds())
    results: list[Any] = []

    def boom() -> None:
        raise FileNotFoundError("x")

    fs.run(SANDBOX, boom).addErrback(results.append)
    assert results[0].check(FileNotFoundError)


@pytest.mark.parametrize("identity", [Identity(0, 5), Identity(5, 0)])
def test_run_refuses_root(identity: Identity) -> None:
    fs, _ = make(FakeIds())
    with pytest.raises(ValueError, match="root"):
        fs.run(identity, lambda: None)


def test_start_and_stop_drive_the_pool_once() -> None:
    fs, pool = make(FakeIds())
    fs.start()
    fs.start()
    assert pool.started
    fs.stop()
    fs.stop()
    assert not pool.started


def test_a_real_pool_runs_the_work_in_a_thread() -> None:
    pool = ThreadPool(minthreads=1, maxthreads=1)
    fs = FsCredentialThreads(ImmediateReactor(), pool, FakeIds())  # type: ignore[arg-type]
    fs.start()
    try:
        assert pool.started
    finally:
        fs.stop()
    assert not pool.started


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.setfsuid = self._make("uid")
        self.setfsgid = self._make("gid")

    def _make(self, which: str) -> Any:
        calls = self.calls

        class Fn:
            argtypes: object = None
            restype: object = None

            def __call__(self, value: int) -> int:
                calls.append((which, value))
                return 7

        return Fn()


def test_libc_ids_pass_minus_one_as_the_unsigned_query() -> None:
    libc = FakeLibc()
    ids = LibcFsIds(libc)
    assert ids.setfsuid(-1) == 7
    assert ids.setfsgid(200000) == 7
    assert libc.calls == [("uid", 0xFFFFFFFF), ("gid", 200000)]


def test_libc_ids_load_the_c_library() -> None:
    ids = LibcFsIds()
    assert ids.setfsuid(-1) >= 0  # a query: changes nothing


def test_drop_supplementary_groups() -> None:
    seen: list[list[int]] = []
    drop_supplementary_groups(seen.append)
    assert seen == [[]]
