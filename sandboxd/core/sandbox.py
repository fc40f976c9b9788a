"""One live sandbox, as the manager keeps it: identity, environment, activity, and what runs."""

from collections.abc import Callable, Mapping
from typing import TypeVar

from attrs import define, field, frozen
from twisted.internet.defer import Deferred

from sandboxd.core.contexts.context import Context
from sandboxd.core.exec.run import ExecRun
from sandboxd.core.processes.table import ProcessTable
from sandboxd.core.templates.store import TemplateRoot
from sandboxd.core.watch.watch import WorkspaceWatch
from sandboxd.isolation.base import Identity
from sandboxd.isolation.network.egress_policy import EgressPolicy
from sandboxd.isolation.sandbox import SandboxIsolation

T = TypeVar("T")


@frozen
class CreateRequest:
    """What a front asks of a new sandbox, parsed from its body: its create-time environment,
    the archive entry it restores from, and its network mode by name (``None``: the replica's
    default). The core checks what they mean: that each entry can be an environment entry,
    and that the mode is offered and allowed here."""

    env: Mapping[str, str] = field(factory=dict)
    item_id: str | None = None
    network: str | None = None
    egress: EgressPolicy | None = None
    """The sandbox's own egress policy (``None``: none asked for; only the ``egress`` mode
    takes one, and the operator's plan checks it)."""
    template: TemplateRoot | None = None
    """The template whose root the sandbox runs in (``None``: the host's root)."""


PLAIN = CreateRequest()
"""A sandbox with no environment, no archive entry, and the default network."""


@define
class Sandbox:
    """One live sandbox."""

    rid: str
    identity: Identity
    env: dict[str, str]
    created: float
    last_active: float
    isolation: SandboxIsolation
    """Its layers (cgroup, directories under their disk limit, namespaces): what starts its
    processes, counts its use, and disposes of it at its end."""
    execs: int = 0
    running: set[ExecRun] = field(factory=set)
    file_calls: set[Deferred[None]] = field(factory=set)
    """File work in flight (each fires when its thread is done): kill waits for them."""
    processes: ProcessTable = field(factory=lambda: ProcessTable(1))
    """Its background processes (docs/extensions.rst, "Background processes"); a silent one
    does not count as running."""
    bodies: set[Callable[[], object]] = field(factory=set)
    """An abort for each request body being spooled in its top directory (its end calls
    them: their connections close, their spools are given back)."""
    watches: set[WorkspaceWatch] = field(factory=set)
    """Its open workspace watches (docs/extensions.rst, "Workspace watch")."""
    contexts: dict[str, Context] = field(factory=dict)
    """Its interpreter contexts by id (docs/extensions.rst, "Contexts")."""
    item_id: str | None = None
    """The archive entry this sandbox restores from and persists to (``None``: none)."""
    network: str = "host"
    """The sandbox's network mode (``none``, ``egress``, ``host``)."""
    template: TemplateRoot | None = None
    """The template whose files are its root (``None``: it sees the host's)."""
    workdir: str = ""
    """Its template's working directory: where a command given no ``cwd`` starts (``""``:
    the workspace)."""
    lives_until: float | None = None
    """When a front bounds this sandbox's life itself (the E2B front's ``timeout``), the time
    it ends: the idle reaper leaves it alone until then. ``None``: ``SANDBOXD_IDLE_TTL``
    applies."""


@frozen
class SandboxListing:
    """What the operators' list shows of one live sandbox."""

    rid: str
    created: float
    last_active: float
    ready: bool
    """Its ready marker is set (docs/contract.rst, "Ready marker")."""
    execs: int
    network: str = "host"
    """Its network mode."""
    egress: EgressPolicy | None = None
    """Its egress policy now (``None``: its mode takes none)."""
    template: str | None = None
    """The template it was made from (``None``: it sees the host's root)."""


@frozen
class BodyPlace:
    """Where request bodies naming a sandbox are spooled as they arrive: its top
    ``directory`` (under its disk limits, out of its sight: unnamed files), written through
    the charge of its ``isolation``; ``bodies`` is the sandbox's (see :attr:`Sandbox.bodies`)."""

    directory: str
    isolation: SandboxIsolation
    bodies: set[Callable[[], object]]

    def charged(self, work: Callable[[], T]) -> Callable[[], T]:
        """``work`` held to the sandbox's disk limits (the disk driver's ``charged``)."""
        return self.isolation.charged(work)
