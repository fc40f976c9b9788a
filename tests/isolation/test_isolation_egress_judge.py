"""The egress judge's daemon side without a kernel: the lines it gives the judge and reads
from it, its process kept running (a Clock, a recording ``spawnProcess``), its queue rule,
and the egress mode handing it the policies it reads (with the host fakes of
``test_isolation_egress``). The real thing: ``tests/kernel/test_egress_judge.py`` (the judge on
a real queue) and ``tests/kernel/test_egress_names.py`` (through the daemon, ``judged``)."""

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from twisted.internet.error import ProcessTerminated
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_host import EgressError
from sandboxd.isolation.network.egress_judge import (
    LINE_MAX,
    RESTART_DELAY,
    EgressJudge,
    JudgeProcess,
    addresses_line,
    policy_line,
)
from sandboxd.isolation.network.egress_judge_plan import JUDGE_QUEUE
from sandboxd.isolation.network.egress_policy import (
    OPEN,
    EgressPolicy,
    parse_policy,
    policy_script,
)
from sandboxd.isolation.network.egress_proxy import EgressProxy
from sandboxd.isolation.network.egress_proxy_start import egress_judge
from sandboxd.isolation.network.egress_rules import parse_rules
from tests.isolation.test_isolation_egress import Host, plan
from tests.isolation.test_isolation_egress_proxy import Resolver

POLICY = parse_policy(["good.example", "*.good.example", "198.51.100.0/24"], ["bad.example"])


class Transport:
    """A judge process's end, as ``spawnProcess`` gives it."""

    def __init__(self) -> None:
        self.written = b""
        self.signals: list[str] = []

    def write(self, data: bytes) -> None:
        self.written += data

    def signalProcess(self, signal: str) -> None:
        self.signals.append(signal)


class Reactor(Clock):
    """A Clock whose ``spawnProcess`` records each judge (or fails while ``refuse`` is set)."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[tuple[JudgeProcess, list[str], Transport]] = []
        self.refuse = False

    def spawnProcess(self, process: JudgeProcess, path: str, args: list[str], **kw: Any) -> None:
        assert kw == {"env": {}, "childFDs": {0: "w", 1: "r", 2: "r"}}
        if self.refuse:
            raise OSError("no such program")
        transport = Transport()
        process.makeConnection(transport)
        self.spawned.append((process, args, transport))


class Rules:
    """``iptables-nft``/``ip6tables-nft`` runs, refused while ``refuse`` says so."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.refuse: set[str] = set()

    def run(self, argv: Sequence[str], stdin: str) -> str:
        self.calls.append(list(argv))
        if argv[4] in self.refuse:
            raise EgressError(f"{argv[0]}: refused")
        return ""


def make(ipv6: bool = True) -> tuple[EgressJudge, Reactor, Rules, EgressProxy, Resolver]:
    reactor, rules = Reactor(), Rules()
    resolver = Resolver({"good.example": ["203.0.113.1", "2001:db8::1"]})
    proxy = EgressProxy(reactor, SimpleNamespace(), resolver, [], lambda a: False)
    judge = EgressJudge(reactor, proxy, program="/bin/judge", ipv6=ipv6, run=rules.run)
    return judge, reactor, rules, proxy, resolver


def test_policy_and_addresses_lines() -> None:
    assert policy_line(7, POLICY) == (
        "policy 7 0 1 +good.example +*.good.example -bad.example +198.51.100.0/24\n"
    )
    e2b = EgressPolicy((), (ipaddress.ip_network("0.0.0.0/0"),), True, ("api.example",))
    assert policy_line(3, e2b) == "policy 3 1 1 +api.example -0.0.0.0/0\n"
    assert policy_line(3, parse_policy(None, ["bad.example"])) == "policy 3 0 0 -bad.example\n"
    found = {ipaddress.ip_address("203.0.113.9"), ipaddress.ip_address("2001:db8::9")}
    assert addresses_line("a.example", 59.6, found) == (
        "addresses a.example 60 2001:db8::9 203.0.113.9\n"
    )
    assert addresses_line("a.example", -1, set()) == "addresses a.example 0\n"


def test_start_adds_the_queue_rule_for_each_family_and_spawns_the_judge() -> None:
    judge, reactor, rules, _, _ = make()
    judge.start()
    rule = ["FORWARD", "-m", "mark", "--mark", "0x100000/0x100000", "-j", "NFQUEUE"]
    rule += ["--queue-num", str(JUDGE_QUEUE)]
    assert rules.calls == [
        ["iptables-nft", "-w", "-t", "mangle", "-D", *rule],  # a predecessor's, if any
        ["ip6tables-nft", "-w", "-t", "mangle", "-D", *rule],
        ["iptables-nft", "-w", "-t", "mangle", "-I", *rule],
        ["ip6tables-nft", "-w", "-t", "mangle", "-I", *rule],
    ]
    (_, args, transport), *_ = reactor.spawned
    assert args == ["/bin/judge", str(JUDGE_QUEUE), "0x100000", "0x200000", "0x400000"]
    rules.calls.clear()
    judge.stop()
    assert transport.signals == ["KILL"]
    assert [call[4] for call in rules.calls] == ["-D", "-D"]


def test_no_rule_of_a_predecessor_to_remove_is_no_error() -> None:
    judge, reactor, rules, _, _ = make(ipv6=False)
    rules.refuse = {"-D"}
    judge.start()
    assert len(reactor.spawned) == 1
    judge.stop()


def test_a_rule_the_host_refuses_leaves_nothing() -> None:
    judge, reactor, rules, _, _ = make(ipv6=False)
    rules.refuse = {"-I"}
    with pytest.raises(EgressError):
        judge.start()
    assert [call[:5] for call in rules.calls][-1] == ["iptables-nft", "-w", "-t", "mangle", "-D"]
    assert reactor.spawned == []


def test_a_judge_that_exits_is_started_again_with_every_policy() -> None:
    judge, reactor, _, _, _ = make()
    judge.start()
    judge.judge("a", 7, POLICY)
    judge.judge("b", 8, parse_policy(None, ["bad.example"]))
    judge.forget("b")
    judge.forget("z")  # never judged: nothing said
    first, _, transport = reactor.spawned[0]
    assert transport.written.decode().splitlines() == [
        policy_line(7, POLICY).strip(),
        "policy 8 0 0 -bad.example",
        "forget 8",
    ]
    first.processEnded(Failure(ProcessTerminated(signal=9)))
    assert len(reactor.spawned) == 1
    judge.judge("c", 9, POLICY)  # while none runs: the next one is told
    reactor.advance(RESTART_DELAY)
    (_, _, again) = reactor.spawned[1]
    assert again.written.decode() == policy_line(7, POLICY) + policy_line(9, POLICY)
    assert transport.written.decode().count("\n") == 3
    first.processEnded(Failure(ProcessTerminated(signal=9)))  # (the old one's: ignored)
    reactor.advance(RESTART_DELAY)
    assert len(reactor.spawned) == 2
    reactor.refuse = True  # the program went: tried again and again, logged
    reactor.spawned[1][0].processEnded(Failure(ProcessTerminated(exitCode=1)))
    reactor.advance(RESTART_DELAY)
    reactor.advance(RESTART_DELAY)
    assert len(reactor.spawned) == 2 and reactor.getDelayedCalls()
    judge.stop()  # the pending start is cancelled
    assert not reactor.getDelayedCalls()
    judge.stop()  # (twice: nothing more)
    reactor.refuse = False
    judge.start()  # the layer again: none of the last one's sandboxes is told of
    assert reactor.spawned[-1][2].written == b""
    judge.stop()


def test_a_stopped_judge_is_not_started_again() -> None:
    judge, reactor, _, _, _ = make()
    judge.start()
    process, _, _ = reactor.spawned[0]
    judge.stop()
    process.processEnded(Failure(ProcessTerminated(signal=9)))
    judge._respawn()  # (a start that was already due)
    assert len(reactor.spawned) == 1 and not reactor.getDelayedCalls()


def test_names_are_resolved_by_the_proxys_resolver_and_refusals_counted() -> None:
    judge, reactor, _, proxy, resolver = make()
    judge.start()
    process, _, transport = reactor.spawned[0]
    judge.judge("a", 7, POLICY)
    transport.written = b""
    process.outReceived(b"ready\nresolve good.example\nresolve nxdomain.example\nresolve Bad")
    process.outReceived(b"!\n")
    assert transport.written.decode().splitlines() == [
        "addresses good.example 5 2001:db8::1 203.0.113.1",  # (the records' TTL)
        "addresses nxdomain.example 0",
        "addresses Bad! 0",  # not a name it could have read: not looked up
    ]
    assert resolver.asked == ["good.example", "nxdomain.example"]
    reactor.advance(2)
    transport.written = b""
    process.outReceived(b"resolve good.example\n")  # kept: 3 s left of it
    assert transport.written == b"addresses good.example 3 2001:db8::1 203.0.113.1\n"
    assert resolver.asked == ["good.example", "nxdomain.example"]
    process.outReceived(b"refused 7 not_allowed 203.0.113.1 other.example\n")
    process.outReceived(b"refused 7 no_name 203.0.113.1 \nrefused 99 too_many 203.0.113.1\n")
    process.outReceived(b"what\nrefused x y\n")  # logged, nothing else
    assert dict(proxy.refused) == {
        ("a", "not_allowed"): 1,
        ("a", "no_name"): 1,
        ("", "too_many"): 1,
    }


def test_a_line_longer_than_any_of_the_judges_ends_it() -> None:
    judge, reactor, _, _, _ = make()
    judge.start()
    process, _, transport = reactor.spawned[0]
    process.outReceived(b"x" * (LINE_MAX + 1))
    assert transport.signals == ["KILL"] and process.pending == b""
    process.errReceived(b"sandboxd-judge: bind queue 7: Device or resource busy\n")


def test_the_mode_hands_the_judge_its_policies(tmp_path: Path) -> None:
    host = Host()
    told: list[tuple[str, Any]] = []

    class Judge:
        fail = False

        def start(self) -> None:
            if self.fail:
                raise EgressError("iptables-nft: no NFQUEUE")
            told.append(("start", None))

        def stop(self) -> None:
            told.append(("stop", None))

        def judge(self, rid: str, ifindex: int, policy: EgressPolicy) -> None:
            told.append(("judge", (rid, ifindex, policy)))

        def forget(self, rid: str) -> None:
            told.append(("forget", rid))

    judge = Judge()
    mode = EgressNetwork(host.egress(tmp_path), capacity=2, judge=judge, ifindex=lambda n: 40)
    mode.proxy = SimpleNamespace(listen=lambda: 4444, close=lambda: None)
    mode.prepare()
    assert mode.egress.plan.judge and "chain judge_mark" in "".join(host.nft_inputs())
    mode.stage_policy("a", POLICY)
    mode.attach("a", "/ns/a")
    assert told == [("start", None), ("judge", ("a", 40, POLICY))]
    assert 'add element inet sandboxd judged { "sbx0" }' in host.nft_inputs()[-1]
    host.fail = "policy0"
    with pytest.raises(OSError, match="egress policy"):
        mode.set_policy("a", OPEN)
    assert told[-2:] == [("forget", "a"), ("judge", ("a", 40, POLICY))]  # as it was
    host.fail = None
    mode.set_policy("a", OPEN)
    assert told[-1] == ("forget", "a")
    mode.set_policy("a", POLICY)
    mode.detach("a", "/ns/a")
    assert told[-1] == ("forget", "a")
    mode.close()
    assert told[-1] == ("stop", None) and not mode.egress.plan.judge
    judge.fail = True  # this host has no judge: the proxy reads every name
    told.clear()
    mode.prepare()
    assert not mode.egress.plan.judge and told == []
    mode.stage_policy("b", POLICY)
    mode.attach("b", "/ns/b")
    assert told == [] and "judged" not in host.nft_inputs()[-1]
    mode.close()
    assert told == []


def test_judged_policies_leave_their_chain_for_the_judge() -> None:
    judging = plan(judge=True, proxy_port=4444)
    script = policy_script(judging, 2, POLICY).splitlines()
    assert 'add element inet sandboxd judged { "sbx2" }' in script
    assert 'delete element inet sandboxd proxied { "sbx2" }' in script
    assert not any("proxy_redirect" in line for line in script)
    assert script[-4] == "add rule inet sandboxd policy2 tcp dport { 80, 443 } return"
    with_rules = EgressPolicy(
        POLICY.allow_out, (), False, POLICY.allow_names, (), parse_rules_for("good.example")
    )
    proxied = policy_script(judging, 2, with_rules).splitlines()
    assert 'delete element inet sandboxd judged { "sbx2" }' in proxied
    assert any("proxy_redirect" in line for line in proxied)
    assert "judged" not in policy_script(plan(proxy_port=4444), 2, POLICY)
    ruleset = judging.ruleset("drop")
    assert "set judged { type ifname; }" in ruleset
    assert "from_sandbox {\n    meta mark and 0x200000 != 0" in ruleset
    assert "judge" not in plan().ruleset("drop")


def parse_rules_for(name: str) -> Any:
    return parse_rules({name: [{"headers": {"X-Key": "v"}}]})


def test_the_judge_is_made_when_asked_for_and_built(tmp_path: Path) -> None:
    reactor = Clock()
    proxy: Any = object()
    off = SimpleNamespace(egress_judge="off")
    on = SimpleNamespace(egress_judge="on")
    assert egress_judge(off, reactor, proxy, True) is None
    assert egress_judge(on, reactor, proxy, True, program=str(tmp_path / "absent")) is None
    program = tmp_path / "sandboxd-judge"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    made = egress_judge(on, reactor, proxy, False, program=str(program))
    assert made is not None and made.program == str(program) and not made.ipv6
