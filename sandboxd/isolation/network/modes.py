"""Network modes of a sandbox (docs/isolation.rst, "Network modes"): ``none``, ``host``, ``egress``.

A mode says whether the sandbox gets a network namespace of its own and what is wired into it.
``none`` is a namespace with only its loopback (up); ``host`` is the host's own network, shared
with the daemon and every other ``host`` sandbox. ``egress`` lives in its own module
(:data:`EGRESS_MODULE`): unless ``SANDBOXD_NETWORK_ALLOW`` leaves it out, its
``network_mode(config)`` gives a :class:`NetworkMode` whose :meth:`~NetworkMode.prepare` readies
the host at start-up (or, offered by default rather than by name, nothing until it is used),
whose :meth:`~NetworkMode.attach` receives the pinned namespace's path right after create pins
it (the place to wire a veth pair and filters), whose :meth:`~NetworkMode.detach` runs at kill,
before the pin is removed, and whose :meth:`~NetworkMode.close` runs at stop. Without it the
name is refused, at start-up when configured and with a ``400`` when a create asks for it.
"""

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from attrs import field, frozen

from sandboxd.isolation.base import IsolationUnavailable

MODES = ("none", "egress", "host")
"""Every mode's name, strongest first."""

EGRESS_MODULE = "sandboxd.isolation.network.egress"


class NetworkUnavailable(Exception):
    """A mode offered by this replica cannot be given to a sandbox now (its create fails; the
    message names the cause and the setting)."""


def egress_named(config: Any) -> bool:
    """Whether the configuration asks for ``egress`` by name (``SANDBOXD_NETWORK=egress`` or
    in ``SANDBOXD_NETWORK_ALLOW``): then start-up fails unless it can be provided."""
    return bool(config.network == "egress" or "egress" in (config.network_allow or ()))


class NetworkMode(Protocol):
    """One network mode a sandbox can be created with."""

    @property
    def name(self) -> str: ...

    @property
    def own_namespace(self) -> bool:
        """True when the sandbox gets a network namespace of its own."""

    def prepare(self) -> None:
        """Make ready on the host what the mode needs (start-up, before any create)."""

    def close(self) -> None:
        """Undo :meth:`prepare` (the daemon stops, every sandbox is gone)."""

    def attach(self, rid: str, netns: str) -> None:
        """Wire the sandbox's pinned network namespace ``netns`` (create, after pinning)."""

    def detach(self, rid: str, netns: str) -> None:
        """Undo :meth:`attach` (kill and recovery, before the pin goes; nothing is no error)."""


@frozen
class HostNetwork:
    """``host``: the host's network, as every sandbox had before network namespaces."""

    name: str = "host"
    own_namespace: bool = False

    def prepare(self) -> None:
        """Nothing to prepare."""

    def close(self) -> None:
        """Nothing to undo."""

    def attach(self, rid: str, netns: str) -> None:
        """Nothing to wire."""

    def detach(self, rid: str, netns: str) -> None:
        """Nothing to undo."""


@frozen
class NoNetwork:
    """``none``: a network namespace of the sandbox's own, its loopback up, nothing else."""

    name: str = "none"
    own_namespace: bool = True

    def prepare(self) -> None:
        """Nothing to prepare."""

    def close(self) -> None:
        """Nothing to undo."""

    def attach(self, rid: str, netns: str) -> None:
        """Nothing to wire (the helper brought the loopback up)."""

    def detach(self, rid: str, netns: str) -> None:
        """Nothing to undo."""


def find_egress(config: Any, module: str = EGRESS_MODULE) -> NetworkMode | None:
    """The ``egress`` mode when its module is installed and the configuration does not leave
    it out (``None`` otherwise); ``IsolationUnavailable`` when the host cannot give it."""
    if importlib.util.find_spec(module) is None:
        return None
    factory = importlib.import_module(module).network_mode
    mode: NetworkMode = factory(config)
    return mode


def parse_modes(text: str) -> tuple[str, ...]:
    """``SANDBOXD_NETWORK_ALLOW``: mode names separated by commas (``ValueError`` otherwise)."""
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    if not names:
        raise ValueError("names no network mode")
    for name in names:
        if name not in MODES:
            raise ValueError(f"{name!r} is not one of {', '.join(MODES)}")
    return names


def parse_mode(text: str) -> str:
    """``SANDBOXD_NETWORK``: one mode name."""
    names = parse_modes(text)
    if len(names) != 1:
        raise ValueError("names more than one network mode")
    return names[0]


@frozen
class NetworkPolicy:
    """The modes this replica offers, those a create may ask for, and the default."""

    offered: Mapping[str, NetworkMode]
    allowed: tuple[str, ...]
    default: str
    why_missing: Mapping[str, str] = field(factory=dict)
    """Why each mode not offered is missing, naming the setting that offers it."""

    @classmethod
    def choose(
        cls,
        offered: Mapping[str, NetworkMode],
        default: str | None,
        allowed: Sequence[str] | None,
        why_missing: Mapping[str, str],
    ) -> "NetworkPolicy":
        """Check the configuration against what is offered; ``IsolationUnavailable`` names the
        variable and the mode. Unset: every offered mode is allowed, the default is the
        strongest allowed one."""
        if allowed is None:
            allowed = [name for name in MODES if name in offered]
        for name in allowed:
            if name not in offered:
                raise IsolationUnavailable(
                    f"SANDBOXD_NETWORK_ALLOW: network mode {name} is not available here"
                    f" ({why_missing.get(name, 'not offered')})"
                )
        if default is None:
            default = next(name for name in MODES if name in allowed)
        if default not in offered:
            raise IsolationUnavailable(
                f"SANDBOXD_NETWORK: network mode {default} is not available here"
                f" ({why_missing.get(default, 'not offered')})"
            )
        if default not in allowed:
            raise IsolationUnavailable(
                f"SANDBOXD_NETWORK: {default} is not in SANDBOXD_NETWORK_ALLOW"
                f" ({', '.join(allowed)})"
            )
        return cls(dict(offered), tuple(allowed), default, dict(why_missing))

    def mode(self, requested: object) -> NetworkMode:
        """The mode for a create's ``network`` field (``None``: the default); ``ValueError``
        names a mode that is unknown, not offered here (and why, with the setting that would
        offer it), or not allowed (with ``SANDBOXD_NETWORK_ALLOW``)."""
        if requested is None:
            return self.offered[self.default]
        if not isinstance(requested, str):
            raise ValueError("must be a string naming a network mode")
        if requested not in MODES:
            raise ValueError(f"{requested!r} is not one of {', '.join(MODES)}")
        if requested not in self.offered:
            why = self.why_missing.get(requested, "not offered")
            raise ValueError(f"network mode {requested} is not offered by this replica ({why})")
        if requested not in self.allowed:
            raise ValueError(
                f"network mode {requested} is not allowed here"
                f" (SANDBOXD_NETWORK_ALLOW={','.join(self.allowed)})"
            )
        return self.offered[requested]

    def capabilities(self) -> list[str]:
        """``network.<mode>`` for each mode a create may ask for."""
        return [f"network.{name}" for name in self.allowed]


def host_only() -> NetworkPolicy:
    """The policy without network namespaces: the host's network, as before."""
    return NetworkPolicy({"host": HostNetwork()}, ("host",), "host")
