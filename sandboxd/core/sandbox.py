"""One live sandbox, as the manager keeps it: identity, environment, activity, and what runs."""

from attrs import define, field
from twisted.internet.defer import Deferred

from sandboxd.core.contexts.context import Context
from sandboxd.core.exec.run import ExecRun
from sandboxd.core.processes.table import ProcessTable
from sandboxd.core.watch.watch import WorkspaceWatch
from sandboxd.isolation.base import Identity


@define
class Sandbox:
    """One live sandbox."""

    rid: str
    identity: Identity
    env: dict[str, str]
    created: float
    last_active: float
    execs: int = 0
    running: set[ExecRun] = field(factory=set)
    file_calls: set[Deferred[None]] = field(factory=set)
    """File work in flight (each fires when its thread is done): kill waits for them."""
    processes: ProcessTable = field(factory=lambda: ProcessTable(1))
    """Its background processes (docs/extensions.rst, "Background processes"); a silent one
    does not count as running."""
    watches: set[WorkspaceWatch] = field(factory=set)
    """Its open workspace watches (docs/extensions.rst, "Workspace watch")."""
    contexts: dict[str, Context] = field(factory=dict)
    """Its interpreter contexts by id (docs/extensions.rst, "Contexts")."""
    item_id: str | None = None
    """The archive entry this sandbox restores from and persists to (``None``: none)."""
    network: str = "host"
    """The sandbox's network mode (``none``, ``egress``, ``host``)."""
    lives_until: float | None = None
    """When a front bounds this sandbox's life itself (the E2B front's ``timeout``), the time
    it ends: the idle reaper leaves it alone until then. ``None``: ``SANDBOXD_IDLE_TTL``
    applies."""
