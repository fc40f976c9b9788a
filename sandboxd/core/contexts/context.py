"""One context's record: its kernel process, the daemon's link to it, and its queue."""

import secrets

from attrs import define, field
from twisted.internet.defer import DeferredLock

from sandboxd.core.contexts.kernel import KernelLink
from sandboxd.core.exec.run import ExecRun


def new_context_id() -> str:
    return secrets.token_hex(8)


@define(eq=False)
class Context:
    """A long-lived kernel in a sandbox. Executions take :attr:`queue` in turn (first come,
    first served); a kernel found ended is started again by the next execution."""

    cid: str
    language: str
    """A name in :data:`sandboxd.core.contexts.languages.LANGUAGES`."""
    cwd: str
    """The working directory as the sandbox sees it, entered when the kernel starts."""
    as_home: bool = False
    """The kernel sees the workspace as its home (the E2B front's contexts)."""
    queue: DeferredLock = field(factory=DeferredLock)
    run: ExecRun | None = None
    """The kernel's process (``None`` until started)."""
    link: KernelLink | None = None
    removed: bool = False
    starts: int = 0
    """How many kernels this context has started."""

    @property
    def alive(self) -> bool:
        """Its kernel runs and is not given up: a kernel killed (:meth:`stop`) is not alive
        even before its process's end is seen, so the next execution starts another."""
        return (
            self.run is not None
            and not self.run.ended
            and self.link is not None
            and not self.link.given_up.is_set()
        )

    def stop(self) -> None:
        """Kill the kernel (its whole process group) and give up the link's wait."""
        if self.link is not None:
            self.link.given_up.set()
        if self.run is not None:
            self.run.abort()

    def describe(self) -> dict[str, str]:
        return {"id": self.cid, "language": self.language, "cwd": self.cwd}
