"""The egress judge's daemon side (docs/isolation.rst, "The judged path"): the judge process
(``sandboxd-judge``, ``sandboxd_judge.c``), kept running while the egress layer is up, and the
one ``NFQUEUE`` rule that feeds it (:mod:`.egress_judge_plan`).

The daemon tells the judge each judged sandbox's policy (by the ifindex of its veth), resolves
the names it asks for with the egress proxy's own resolver and cache (never the sandbox's
DNS answers), and counts its refusals with the proxy's (per sandbox and reason, logged). A
judge that exits is started again after :data:`RESTART_DELAY` and given every policy anew;
meanwhile the kernel drops what it would have queued (no bypass): judged sandboxes' web
connections wait or fail, none leaves unjudged.
"""

from pathlib import Path
from typing import Any

from attrs import define, field
from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from sandboxd.isolation.network.egress_host import EgressError, RunWithInput, run_program
from sandboxd.isolation.network.egress_judge_plan import JUDGE_QUEUE, judge_argv, queue_rule
from sandboxd.isolation.network.egress_names import MAX_NAME, normal_name
from sandboxd.isolation.network.egress_plan import Address
from sandboxd.isolation.network.egress_policy import EgressPolicy
from sandboxd.isolation.network.egress_proxy import EgressProxy

log = Logger()

JUDGE_PROGRAM = Path(__file__).with_name("sandboxd-judge")
"""Where the build puts the judge (``helper_build``): beside its source."""

RESTART_DELAY = 1.0
"""Seconds between a judge's exit and the next one's start."""

LINE_MAX = MAX_NAME + 128
"""The longest line the judge writes; a longer one means it is not the judge talking."""

TABLES = ("iptables-nft", "ip6tables-nft")


def policy_line(ifindex: int, policy: EgressPolicy) -> str:
    """The judge's ``policy`` line for a sandbox's veth (``sandboxd_judge.c`` says its form)."""
    entries = [f"+{name}" for name in policy.allow_names]
    entries += [f"-{name}" for name in policy.deny_names]
    entries += [f"+{net}" for net in policy.allow_out or ()]
    entries += [f"-{net}" for net in policy.deny_out]
    wins = int(policy.allow_wins)
    restricted = int(policy.allow_out is not None)
    return " ".join(["policy", str(ifindex), str(wins), str(restricted), *entries]) + "\n"


def addresses_line(name: str, ttl: float, addresses: set[Address]) -> str:
    """The answer to the judge's ``resolve NAME``: the name's addresses, kept ``ttl`` s."""
    listed = " ".join(sorted(str(a) for a in addresses))
    return f"addresses {name} {max(0.0, ttl):.0f} {listed}".rstrip() + "\n"


class JudgeProcess(protocol.ProcessProtocol):
    """One judge process: its lines go to :meth:`EgressJudge.heard`, its end to
    :meth:`EgressJudge.ended`."""

    def __init__(self, judge: "EgressJudge") -> None:
        self.judge = judge
        self.pending = b""

    def outReceived(self, data: bytes) -> None:
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        if len(self.pending) > LINE_MAX:  # not the judge's: end it (it starts again)
            self.pending = b""
            self.transport.signalProcess("KILL")  # type: ignore[union-attr]
            return
        for line in lines:
            self.judge.heard(line.decode("ascii", "replace"))

    def errReceived(self, data: bytes) -> None:
        log.warn("egress judge: {text}", text=data.decode("utf-8", "replace").strip())

    def processEnded(self, reason: Any) -> None:
        self.judge.ended(self, reason.value)


@define
class EgressJudge:
    """The judge of one daemon (see the module): :meth:`start` with the egress layer,
    :meth:`stop` with it."""

    reactor: Any
    proxy: EgressProxy
    """Whose resolver and name cache answer the judge, and who counts its refusals."""
    program: str = str(JUDGE_PROGRAM)
    queue: int = JUDGE_QUEUE
    ipv6: bool = True
    """Whether IPv6 is queued too (the egress pool has IPv6)."""
    run: RunWithInput = run_program
    _process: JudgeProcess | None = None
    _running: bool = False
    _restart: IDelayedCall | None = None
    _policies: dict[int, str] = field(factory=dict)
    """Each judged veth's policy line, by ifindex (given again to a new judge)."""
    _rids: dict[int, str] = field(factory=dict)
    """Each judged veth's sandbox, by ifindex (for the refusals' counts)."""
    _ifindexes: dict[str, int] = field(factory=dict)
    """Each judged sandbox's veth, by sandbox (the inverse of ``_rids``)."""

    def start(self) -> None:
        """Start the judge and add the queue rule (a predecessor's removed first);
        :class:`EgressError` when the rule cannot be added (no ``iptables-nft``, no ``NFQUEUE``
        in the kernel): nothing of it is left then."""
        self._rules("-D", missing_ok=True)
        try:
            self._rules("-I")
        except EgressError:
            self._rules("-D", missing_ok=True)
            raise
        self._running = True
        self._spawn()
        log.info("egress judge: judging on queue {queue}", queue=self.queue)

    def stop(self) -> None:
        """End the judge and remove the queue rule (then nothing is queued any more)."""
        self._running = False
        if self._restart is not None and self._restart.active():
            self._restart.cancel()
        self._restart = None
        if self._process is not None and self._process.transport is not None:
            self._process.transport.signalProcess("KILL")
        self._process = None
        self._policies.clear()  # (the layer's end: none of its sandboxes is left)
        self._rids.clear()
        self._ifindexes.clear()
        self._rules("-D", missing_ok=True)

    def _rules(self, action: str, missing_ok: bool = False) -> None:
        for table in TABLES[: 2 if self.ipv6 else 1]:
            try:
                self.run([table, "-w", "-t", "mangle", action, *queue_rule(self.queue)], "")
            except EgressError:
                if not missing_ok:
                    raise

    def _spawn(self) -> None:
        process = JudgeProcess(self)
        argv = judge_argv(self.program, self.queue)
        try:
            self.reactor.spawnProcess(
                process, argv[0], argv, env={}, childFDs={0: "w", 1: "r", 2: "r"}
            )
        except OSError as e:
            log.error("egress judge: cannot start {program}: {e}", program=self.program, e=e)
            self._restart = self.reactor.callLater(RESTART_DELAY, self._respawn)
            return
        self._process = process
        for line in self._policies.values():
            self._send(line)

    def _respawn(self) -> None:
        self._restart = None
        if self._running:
            self._spawn()

    def ended(self, process: JudgeProcess, why: object) -> None:
        """A judge exited: another one starts after :data:`RESTART_DELAY`, unless stopped."""
        if process is not self._process:  # (one that was stopped)
            return
        self._process = None
        log.error("egress judge: exited ({why}); starting again", why=why)
        self._restart = self.reactor.callLater(RESTART_DELAY, self._respawn)

    def _send(self, line: str) -> None:
        if self._process is not None and self._process.transport is not None:
            self._process.transport.write(line.encode())

    def judge(self, rid: str, ifindex: int, policy: EgressPolicy) -> None:
        """Judge the web connections of sandbox ``rid``'s veth ``ifindex`` by ``policy``."""
        self._policies[ifindex] = line = policy_line(ifindex, policy)
        self._rids[ifindex] = rid
        self._ifindexes[rid] = ifindex
        self._send(line)

    def forget(self, rid: str) -> None:
        """Sandbox ``rid``'s veth is judged no more (it went, or its policy changed); nothing
        when it was not judged."""
        ifindex = self._ifindexes.pop(rid, None)
        if ifindex is not None:
            del self._policies[ifindex], self._rids[ifindex]
            self._send(f"forget {ifindex}\n")

    def heard(self, line: str) -> None:
        """One line of the judge's (``sandboxd_judge.c`` lists them)."""
        words = line.split(" ")
        if words[:1] == ["ready"]:
            log.info("egress judge: ready")
        elif words[0] == "resolve" and len(words) == 2:
            self._resolve(words[1])
        elif words[0] == "refused" and len(words) in (4, 5) and words[1].isdigit():
            rid = self._rids.get(int(words[1]), "")
            name = words[4] if len(words) == 5 else ""
            self.proxy.refuse(rid, words[2], name, words[3])
        else:
            log.warn("egress judge: unexpected line {line!r}", line=line[:80])

    def _resolve(self, name: str) -> None:
        try:
            checked = normal_name(name)
        except ValueError:
            checked = ""
        if checked != name:  # the judge asks only for names it read as such
            self._send(addresses_line(name, 0, set()))
            return

        def answer(addresses: set[Address]) -> None:
            kept = self.proxy.names.kept_for(name)
            self._send(addresses_line(name, kept, addresses))

        self.proxy.names.resolve(name).addCallback(answer)
