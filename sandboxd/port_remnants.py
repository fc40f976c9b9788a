"""Connections that no process holds any more, found and destroyed on one local TCP port.

A process that accepted connections on the daemon's port and closed them (a sandbox in
``host`` network mode that squatted the port while the daemon was down) leaves them in
``TIME_WAIT`` (or another closing state) for up to a minute after it is killed. Its sockets
did not set ``SO_REUSEADDR``, so the kernel refuses every bind of that port meanwhile: the
restarted daemon could not listen. These remnants belong to no process (their inode is 0);
the kernel's socket diagnostics (``sock_diag(7)``, ``SOCK_DESTROY``: ``ss -K``) removes them.

Just enough netlink for that: one dump of the port's TCP sockets per family, one destroy per
orphan. Needs ``CAP_NET_ADMIN`` and a kernel with ``CONFIG_INET_DIAG_DESTROY``.
"""

import os
import socket
import struct
from collections.abc import Iterator

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY, SOCK_DESTROY = 20, 21
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_FIN_WAIT1, TCP_FIN_WAIT2, TCP_TIME_WAIT, TCP_LAST_ACK, TCP_LISTEN, TCP_CLOSING = (
    4,
    5,
    6,
    9,
    10,
    11,
)
CLOSING_STATES = (TCP_FIN_WAIT1, TCP_FIN_WAIT2, TCP_TIME_WAIT, TCP_LAST_ACK, TCP_CLOSING)
_HEADER = struct.Struct("=IHHII")
_REQUEST = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states (then the socket id)
_MESSAGE = struct.Struct("=BBBB")  # family, state, timer, retrans (then the socket id, ...)
_ID_SIZE = 48
_INODE_AT = _MESSAGE.size + _ID_SIZE + 16  # after expires, rqueue, wqueue, uid


def _request(kind: int, flags: int, family: int, states: int, sock_id: bytes) -> bytes:
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, states) + sock_id
    return _HEADER.pack(_HEADER.size + len(body), kind, flags, 0, 0) + body


def _messages(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of the kernel's answers up to ``NLMSG_DONE`` or an error."""
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
            payload = data[offset + _HEADER.size : offset + length]
            offset += (length + 3) & ~3
            if kind == NLMSG_DONE:
                return
            yield kind, payload
            if kind == NLMSG_ERROR:
                return


def _error(payload: bytes) -> int:
    return -int(struct.unpack_from("=i", payload)[0])


def orphans(
    sock: socket.socket, family: int, port: int, states: tuple[int, ...] = CLOSING_STATES
) -> list[bytes]:
    """The socket ids of TCP sockets in ``states`` (by default: closing connections) on local
    ``port`` that no process holds (inode 0; a listening socket always has one)."""
    mask = sum(1 << state for state in states)
    sock.send(_request(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, family, mask, bytes(48)))
    found = []
    for kind, payload in _messages(sock):
        if kind == NLMSG_ERROR:
            raise OSError(_error(payload), f"sock_diag dump: {os.strerror(_error(payload))}")
        sock_id = payload[_MESSAGE.size : _MESSAGE.size + _ID_SIZE]
        local_port = struct.unpack_from("!H", sock_id)[0]
        (inode,) = struct.unpack_from("=I", payload, _INODE_AT)
        if local_port == port and (inode == 0 or states == (TCP_LISTEN,)):
            found.append(sock_id)
    return found


def destroy_orphans(port: int) -> int:
    """Destroy every closing TCP connection on local ``port`` (IPv4 and IPv6) that no process
    holds; how many. None when a socket listens on the port (a live process holds it: that is
    not for this to undo). Raises ``OSError`` when the kernel refuses (no ``CAP_NET_ADMIN``, or
    no ``CONFIG_INET_DIAG_DESTROY``: ``EOPNOTSUPP``)."""
    with _diag() as sock:
        if any(orphans(sock, family, port, (TCP_LISTEN,)) for family in FAMILIES):
            return 0
    return destroy_closing(port)


def destroy_closing(port: int) -> int:
    """Destroy every closing TCP connection on local ``port`` that no process holds, whoever
    listens on the port; how many."""
    destroyed = 0
    with _diag() as sock:
        for family in FAMILIES:
            for sock_id in orphans(sock, family, port):
                state_mask = sum(1 << state for state in CLOSING_STATES)
                sock.send(
                    _request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, family, state_mask, sock_id)
                )
                for kind, payload in _messages(sock):
                    code = _error(payload) if kind == NLMSG_ERROR else 0
                    if code not in (0, 2):  # ENOENT: it expired meanwhile
                        raise OSError(code, f"SOCK_DESTROY: {os.strerror(code)}")
                destroyed += 1
    return destroyed


FAMILIES = (socket.AF_INET, socket.AF_INET6)


def _diag() -> socket.socket:
    return socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
    )
