"""The drain: every sandbox goes once it is idle, all of them by the deadline
(docs/operating.rst, "Drain and rolling updates").

*Idle* during a drain is stricter than "no command runs": no call, no running command and no
output for ``SANDBOXD_DRAIN_IDLE``, so an agent between two commands of one turn keeps its
sandbox. A forced stop (a second SIGINT/SIGTERM) ends the wait at once.
"""

from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from attrs import define
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from sandboxd.config import Config
from sandboxd.core.sandbox import Sandbox
from sandboxd.isolation.base import Isolation
from sandboxd.metrics import Metrics
from sandboxd.units import format_duration

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


class Drains:
    """The manager's drain (a mixin: the manager provides these attributes)."""

    config: Config
    clock: IReactorTime
    isolation: Isolation
    sandboxes: dict[str, Sandbox]
    draining: bool
    metrics: Metrics
    drain_poll: float
    _drained: list[Deferred[None]] | None
    _forced: bool

    async def kill(self, rid: str) -> None:
        raise NotImplementedError  # pragma: no cover - the manager's

    def drain(self) -> Deferred[None]:
        """Refuse new sandboxes; kill each once idle for ``drain_idle`` (no call, no command, no
        output), every one left when ``drain_deadline`` passes or :meth:`stop_now` is called.
        Fires once that is done; calling it again waits for the same drain.
        """
        waiter: Deferred[None] = Deferred()
        if self._drained is None:
            self._drained = [waiter]
            Deferred.fromCoroutine(self._drain()).addBoth(self._drain_done)
        elif not self._drained and not self.sandboxes:
            return succeed(None)
        else:
            self._drained.append(waiter)
        return waiter

    def stop_now(self) -> None:
        """End the drain's wait at once: every sandbox left is killed (a second signal)."""
        self._forced = True

    async def _drain(self) -> None:
        self.draining = True
        busy = sum(len(s.running) for s in self.sandboxes.values())
        log.info(
            "draining: {sandboxes} sandboxes, {busy} commands running; each goes once idle for "
            "{idle} (no call, command or output), all of them within {deadline}",
            sandboxes=len(self.sandboxes),
            busy=busy,
            idle=format_duration(self.config.drain_idle),
            deadline=format_duration(self.config.drain_deadline),
        )
        loop = DrainLoop(
            self.clock,
            self.sandboxes,
            self._kill_all,
            grace=self.config.drain_idle,
            deadline=self.config.drain_deadline,
            poll=self.drain_poll,
            forced=lambda: self._forced,
        )
        self.metrics.drain_waiting.set_function(lambda: float(len(self.sandboxes)))
        report = await loop.run()
        self.metrics.drain_kills.labels("idle").inc(report.went_idle)
        self.metrics.drain_kills.labels(report.ended if report.cut else "idle").inc(report.cut)
        log.info(
            "drained in {seconds:.1f} s ({ended}): waited for {waited} sandboxes, {went_idle} "
            "went idle, {cut} killed still in use",
            seconds=report.seconds,
            ended={"idle": "all idle", "deadline": "deadline passed", "forced": "stopped at once"}[
                report.ended
            ],
            waited=report.waited,
            went_idle=report.went_idle,
            cut=report.cut,
        )
        # The drain ends the daemon: its (now empty) instance cgroups go too, or every clean
        # stop on a new state root would leave one behind in each hierarchy.
        try:
            self.isolation.cgroups.remove_instance()
        except OSError as e:
            log.warn("cannot remove the instance cgroups: {why}", why=e)
        self.isolation.close()

    async def _kill_all(self, rids: list[str]) -> None:
        kills = [Deferred.fromCoroutine(self.kill(rid)) for rid in rids]
        await DeferredList(kills, consumeErrors=True)

    def _drain_done(self, result: object) -> None:
        waiters, self._drained = self._drained or [], []
        for waiter in waiters:
            waiter.callback(None)
