"""The judged path of egress by name: the rules that hand each judged connection's first
payload to the egress judge (``sandboxd-judge``, ``sandboxd_judge.c``) and carry out its
verdict (docs/isolation.rst, "Egress by name"). Pure values only.

A sandbox whose policy names hosts, sets no header and names no SOCKS5 proxy may be *judged*
instead of proxied: its veth is in the ``judged`` set, and its web connections (TCP to
:data:`WEB_PORTS`) are forwarded by the kernel, not relayed. Each such
connection is marked *pending* in its conntrack mark when it starts. While it is pending:

- a packet from the sandbox that carries data (any byte past its TCP header: checked exactly,
  from the IP length and the TCP data offset, so a sandbox cannot slip data through in small
  segments) gets the packet mark :data:`JUDGE_MARK`, which the one ``NFQUEUE`` rule this needs
  (``iptables-nft``: this kernel's nftables has no ``queue`` statement of its own, but
  ``nft_compat`` runs the xtables target) queues to the judge; the queue has no bypass, so
  while no judge listens those packets are dropped (fail closed);
- a packet towards the sandbox that carries data is dropped (a server that speaks first
  reaches the sandbox only once the connection is allowed); the handshake's own segments pass;
- IPv4 options and IPv6 extension headers are refused (the judge reads plain TCP only).

The judge answers with the packet's mark :data:`ALLOW_MARK` or :data:`REFUSE_MARK`, which the
forward chain saves on the connection: allowed, the connection leaves the judged path and every
later packet stays in the kernel; refused, it is reset, and every later packet of it too.
"""

from collections.abc import Iterable

JUDGE_MARK = 0x00100000
"""Packet mark: queue this packet to the judge; conntrack mark: the connection is pending."""
ALLOW_MARK = 0x00200000
"""The judge's verdict, allowed (packet mark, then the connection's)."""
REFUSE_MARK = 0x00400000
"""The judge's verdict, refused (packet mark, then the connection's)."""
MARKS = JUDGE_MARK | ALLOW_MARK | REFUSE_MARK

JUDGE_QUEUE = 7
"""The NFQUEUE the judge reads."""

WEB_PORTS = (80, 443)
"""The TCP ports a policy by name reads names on (HTTP by ``Host``, TLS by SNI)."""

TCP_HEADER_WORDS = range(5, 16)
"""Every TCP data offset (32-bit words): 20 to 60 bytes of header."""


def _empty_segments() -> str:
    """The rules accepting TCP segments without data, one per data offset: IPv4 without
    options (``ip length``, the whole packet), IPv6 without extension headers (``ip6
    length``, the payload after the fixed header). (Not one set of ``tcp doff . ip length``:
    nft 1.0.6 loads such a set but aborts listing it.)"""
    four = "".join(
        f"    ip hdrlength 5 tcp doff {words} ip length {20 + 4 * words} accept\n"
        for words in TCP_HEADER_WORDS
    )
    six = "".join(
        f"    ip6 nexthdr tcp tcp doff {words} ip6 length {4 * words} accept\n"
        for words in TCP_HEADER_WORDS
    )
    return four + six


def judge_chains(veth: str, ports: Iterable[int]) -> str:
    """The table's ``judged`` set and the chains that mark pending connections and queue
    their data (``veth``: the sandbox veths' name pattern, as the ruleset writes it).

    ``judge_mark`` hooks ``forward`` before the mangle table's ``NFQUEUE`` rule (priority
    -150) sees the packet; ``judge_empty`` accepts (for this hook: the next chains still run) a
    segment without data, which needs no judge. Every handshake's SYN makes its connection
    pending anew, whatever its conntrack mark said: the kernel may take a new connection on the
    ports of one reset from the server's side for that same connection (``ct state`` is not
    ``new`` then), which must not inherit its verdict.
    """
    listed = ", ".join(str(port) for port in ports)
    pending = f"ct mark and {MARKS:#x} == {JUDGE_MARK:#x}"
    restart = f"ct mark set ct mark and {~MARKS & 0xFFFFFFFF:#x} or {JUDGE_MARK:#x}"
    return f"""  set judged {{ type ifname; }}
  chain judge_empty {{
{_empty_segments()}  }}
  chain judge_mark {{
    type filter hook forward priority -200; policy accept;
    iifname @judged tcp flags & (syn | ack) == syn tcp dport {{ {listed} }} {restart}
    {pending} iifname @judged ip hdrlength != 5 drop
    {pending} iifname @judged meta nfproto ipv6 ip6 nexthdr != tcp drop
    {pending} jump judge_empty
    {pending} iifname @judged meta mark set meta mark or {JUDGE_MARK:#x}
    {pending} oifname {veth} drop
  }}
"""


def verdict_rules() -> list[str]:
    """The first rules of the ruleset's ``from_sandbox`` chain: the judge's verdict saved on the
    connection (a packet the judge let go without one, empty, gets none), a refused connection
    reset."""
    reset = "reject with tcp reset"
    keep = f"{~MARKS & 0xFFFFFFFF:#x}"
    return [
        f"meta mark and {ALLOW_MARK:#x} != 0 ct mark set ct mark and {keep} or {ALLOW_MARK:#x}",
        f"meta mark and {REFUSE_MARK:#x} != 0 ct mark set ct mark and {keep} or {REFUSE_MARK:#x}",
        f"ct mark and {REFUSE_MARK:#x} != 0 meta l4proto tcp {reset}",
        f"ct mark and {REFUSE_MARK:#x} != 0 drop",
    ]


def queue_rule(queue: int) -> list[str]:
    """The ``iptables-nft``/``ip6tables-nft`` arguments (after ``-t mangle -I`` or ``-D``) of
    the rule queueing marked packets to the judge (no bypass: dropped while none listens)."""
    return [
        "FORWARD",
        "-m",
        "mark",
        "--mark",
        f"{JUDGE_MARK:#x}/{JUDGE_MARK:#x}",
        "-j",
        "NFQUEUE",
        "--queue-num",
        str(queue),
    ]


def judge_argv(program: str, queue: int) -> list[str]:
    """How the judge starts (``sandboxd_judge.c`` says what each argument is)."""
    return [program, str(queue), f"{JUDGE_MARK:#x}", f"{ALLOW_MARK:#x}", f"{REFUSE_MARK:#x}"]
