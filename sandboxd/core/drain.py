"""The drain: every sandbox goes once it is idle, all of them by the deadline
(docs/operating.rst, "Drain and rolling updates").

*Idle* during a drain is stricter than "no command runs": no call, no running command and no
output for ``SANDBOXD_DRAIN_IDLE``, so an agent between two commands of one turn keeps its
sandbox. A forced stop (a second SIGINT/SIGTERM) ends the wait at once.
"""

from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from attrs import define
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from sandboxd.core.sandbox import Sandbox

log = Logger()

Ending = Literal["idle", "deadline", "forced"]
"""How a drain ended: every sandbox went idle, the deadline passed, or a forced stop."""


@define
class DrainReport:
    """What one drain waited for and how it ended."""

    waited: int
    """Sandboxes alive when the drain began."""
    went_idle: int = 0
    """Killed once idle for ``SANDBOXD_DRAIN_IDLE``."""
    cut: int = 0
    """Killed still in use, at the deadline or by a forced stop."""
    ended: Ending = "idle"
    seconds: float = 0.0


def idle_for(sandboxes: Iterable[Sandbox], now: float, grace: float) -> list[Sandbox]:
    """The sandboxes with no running command and no call or output for ``grace`` seconds."""
    return [s for s in sandboxes if not s.running and now - s.last_active >= grace]


@define
class DrainLoop:
    """Kills each sandbox of ``sandboxes`` once idle, the rest at the deadline or when forced."""

    clock: IReactorTime
    sandboxes: dict[str, Sandbox]
    kill_all: Callable[[list[str]], Awaitable[object]]
    grace: float
    deadline: float
    poll: float
    forced: Callable[[], bool]

    async def run(self) -> DrainReport:
        """Drain until no sandbox is left; the report says how."""
        start = self.clock.seconds()
        report = DrainReport(waited=len(self.sandboxes))
        while self.sandboxes:
            now = self.clock.seconds()
            if self.forced():
                report.ended = "forced"
                break
            if now - start >= self.deadline:
                report.ended = "deadline"
                break
            idle = idle_for(self.sandboxes.values(), now, self.grace)
            for sandbox in idle:
                log.info(
                    "drain: sandbox {rid} idle for {idle:.0f} s: killing",
                    rid=sandbox.rid,
                    idle=now - sandbox.last_active,
                )
            if idle:
                report.went_idle += len(idle)
                await self.kill_all([s.rid for s in idle])
                continue
            await deferLater(self.clock, self.poll, lambda: None)
        report.cut = len(self.sandboxes)
        if report.cut:
            why = "the drain deadline passed" if report.ended == "deadline" else "stopping at once"
            log.warn("drain: {why}: killing {cut} sandboxes still in use", why=why, cut=report.cut)
            await self.kill_all(list(self.sandboxes))
        report.seconds = self.clock.seconds() - start
        return report
