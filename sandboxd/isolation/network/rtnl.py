"""Just enough rtnetlink to wire a veth pair: create it, address it, bring it up, route.

Spawning ``ip`` and ``nsenter`` for each step costs milliseconds per program; these requests go
straight to the kernel over a netlink socket. A socket opened in a network namespace stays
there, so :func:`socket_in` opens one in a sandbox's namespace from a short-lived thread that
``setns``-es into it (the calling thread never changes namespace). Each request waits for the
kernel's acknowledgement; a refusal raises ``OSError`` with the kernel's errno.
"""

import os
import socket
import struct

from sandboxd.isolation.network.egress_plan import Address
from sandboxd.isolation.network.netns_calls import in_a_thread_of_its_own, setns_net

NETLINK_ROUTE = 0
RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 20, 24
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLMSG_ERROR = 2
IFF_UP = 0x1
IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFA_LOCAL, IFA_ADDRESS, IFA_FLAGS = 2, 1, 8
IFA_F_NODAD = 0x02
RTA_GATEWAY, RTA_OIF = 5, 4
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 3, 0, 1
NLA_F_NESTED = 0x8000


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _nested(kind: int, *attrs: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, b"".join(attrs))


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


def _family(address: Address) -> int:
    return socket.AF_INET if address.version == 4 else socket.AF_INET6


class Rtnl:
    """One rtnetlink socket (in the namespace it was opened in) and its requests."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, body: bytes) -> None:
        """Send one request and wait for its acknowledgement (``OSError`` when refused)."""
        self.seq += 1
        header = struct.pack(
            "IHHII", 16 + len(body), kind, flags | NLM_F_REQUEST | NLM_F_ACK, self.seq, 0
        )
        self.sock.send(header + body)
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, msg_type, _, seq, _ = struct.unpack_from("IHHII", data, offset)
                if msg_type == NLMSG_ERROR and seq == self.seq:
                    (code,) = struct.unpack_from("i", data, offset + 16)
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    return
                # Not our ack (an earlier request's late answer): skipped.
                offset += max(length, 16)

    def add_veth(self, name: str, peer: str, peer_netns_fd: int) -> None:
        """A veth pair ``name`` (here, up) and ``peer`` (in the namespace of the fd, down)."""
        peer_info = (
            _ifinfo()
            + _attr(IFLA_IFNAME, peer.encode() + b"\0")
            + _attr(IFLA_NET_NS_FD, struct.pack("I", peer_netns_fd))
        )
        body = (
            _ifinfo(flags=IFF_UP, change=IFF_UP)
            + _attr(IFLA_IFNAME, name.encode() + b"\0")
            + _nested(
                IFLA_LINKINFO,
                _attr(IFLA_INFO_KIND, b"veth"),
                _nested(IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_info)),
            )
        )
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)

    def set_up(self, index: int) -> None:
        self.request(RTM_NEWLINK, 0, _ifinfo(index, IFF_UP, IFF_UP))

    def add_address(self, index: int, address: Address, prefix: int) -> None:
        """``address/prefix`` on the link (without duplicate address detection)."""
        packed = address.packed
        body = struct.pack("BBBBI", _family(address), prefix, IFA_F_NODAD, RT_SCOPE_UNIVERSE, index)
        body += _attr(IFA_LOCAL, packed) + _attr(IFA_ADDRESS, packed)
        body += _attr(IFA_FLAGS, struct.pack("I", IFA_F_NODAD))
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body)

    def add_default_route(self, index: int, gateway: Address) -> None:
        body = struct.pack(
            "BBBBBBBBI",
            _family(gateway),
            0,
            0,
            0,
            RT_TABLE_MAIN,
            RTPROT_BOOT,
            RT_SCOPE_UNIVERSE,
            RTN_UNICAST,
            0,
        )
        body += _attr(RTA_GATEWAY, gateway.packed) + _attr(RTA_OIF, struct.pack("I", index))
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body)


def open_here() -> Rtnl:
    """An rtnetlink socket in the calling thread's network namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    sock.bind((0, 0))
    return Rtnl(sock)


def socket_in(netns_fd: int) -> tuple[Rtnl, int, int]:
    """An rtnetlink socket in the namespace of ``netns_fd``, with the indexes there of
    ``eth0`` and ``lo``: opened by a thread that enters that namespace and then ends (the
    caller's thread never leaves its own)."""

    def work() -> tuple[Rtnl, int, int]:
        setns_net(netns_fd)
        return open_here(), socket.if_nametoindex("eth0"), socket.if_nametoindex("lo")

    return in_a_thread_of_its_own(work, "sandboxd-egress-netns")
