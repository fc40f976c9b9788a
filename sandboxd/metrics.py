"""Prometheus metrics of one daemon (``GET /metrics``), in a registry of its own.

A registry per manager (not prometheus_client's global one) keeps several daemons in one
process, as the tests make, from mixing their counts.
"""

from collections.abc import Callable

from attrs import define, field
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 600)


@define
class Metrics:
    """Every metric the daemon exports."""

    registry: CollectorRegistry = field(factory=CollectorRegistry)
    sandboxes: Gauge = field(init=False)
    execs_in_flight: Gauge = field(init=False)
    exec_seconds: Histogram = field(init=False)
    exec_exits: Counter = field(init=False)
    created: Counter = field(init=False)
    killed: Counter = field(init=False)
    reaped: Counter = field(init=False)
    oom_kills: Counter = field(init=False)
    uid_pool_free: Gauge = field(init=False)
    draining: Gauge = field(init=False)
    drain_waiting: Gauge = field(init=False)
    drain_kills: Counter = field(init=False)
    egress_refused: Counter = field(init=False)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.sandboxes = Gauge("sandboxd_sandboxes", "Live sandboxes", registry=r)
        self.execs_in_flight = Gauge("sandboxd_execs_in_flight", "Commands running now", registry=r)
        self.exec_seconds = Histogram(
            "sandboxd_exec_seconds",
            "Time from exec request to final frame",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.exec_exits = Counter(
            "sandboxd_exec_exits", "Finished commands by exit code", ["code"], registry=r
        )
        self.created = Counter("sandboxd_sandboxes_created", "Sandboxes created", registry=r)
        self.killed = Counter("sandboxd_sandboxes_killed", "Sandboxes killed", registry=r)
        self.reaped = Counter(
            "sandboxd_sandboxes_reaped", "Sandboxes killed by the idle reaper", registry=r
        )
        self.oom_kills = Counter(
            "sandboxd_oom_kills", "OOM kills in sandboxes that were since killed", registry=r
        )
        self.uid_pool_free = Gauge("sandboxd_uid_pool_free", "Free uids in the pool", registry=r)
        self.draining = Gauge("sandboxd_draining", "1 while draining", registry=r)
        self.drain_waiting = Gauge(
            "sandboxd_drain_waiting", "Sandboxes a drain still waits for", registry=r
        )
        self.drain_kills = Counter(
            "sandboxd_drain_kills",
            "Sandboxes a drain killed: idle, at the deadline, or in a forced stop",
            ["reason"],
            registry=r,
        )

        self.egress_refused = Counter(
            "sandboxd_egress_refused",
            "Connections the egress proxy refused, by sandbox and reason",
            ["sandbox", "reason"],
            registry=r,
        )

    def watch(self, free_uids: Callable[[], float], draining: Callable[[], float]) -> None:
        """Read the pool and drain state when scraped."""
        self.uid_pool_free.set_function(free_uids)
        self.draining.set_function(draining)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
