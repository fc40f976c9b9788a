"""A command's last output is kept when the moment after its exit runs out before the reactor
has read its pipes (a busy daemon: timers run before I/O in a reactor turn)."""

import os

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater
from twisted.python.failure import Failure

from sandboxd import _twisted
from sandboxd.core.exec.run import LINGER_AFTER_EXIT, ExecRun, Exited


class ExitRecorded(ExecRun):
    """An :class:`ExecRun` that says when its command has exited."""

    exited: Deferred[None]

    def processExited(self, reason: Failure) -> None:
        super().processExited(reason)
        self.exited.callback(None)


@pytest.mark.parametrize(
    ("script", "out", "err"),
    [
        ("echo out; echo err >&2; exit 3", b"out\n", b"err\n"),
        ("echo out; exit 3", b"out\n", b""),  # a pipe with nothing waiting is not read
    ],
    ids=["both-pipes", "stdout-only"],
)
@pytest_twisted.ensureDeferred
async def test_output_still_in_the_pipes_when_the_linger_ends_is_kept(
    script: str, out: bytes, err: bytes
) -> None:
    clock = Clock()
    run = ExitRecorded(clock, lambda fd, data: None, max_output=1 << 20, log_timeout=60, timeout=60)
    run.exited = Deferred()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        run.start(reactor, ["/bin/sh", "-c", script], {}, None, devnull)
        # The reactor never comes round to the pipes, as when it is too busy to.
        for reader in _twisted.output_readers(run.transport):
            reactor.removeReader(reader)
        await run.exited
        await deferLater(reactor, 0.05, lambda: None)
        clock.advance(LINGER_AFTER_EXIT)
        outcome = await run.when_finished()
    finally:
        os.close(devnull)
    assert isinstance(outcome, Exited)
    assert (outcome.code, outcome.out, outcome.err) == (3, out, err)
