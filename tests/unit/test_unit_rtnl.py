"""``Rtnl.request``'s reading of answers: its own ack among others, and a refusal."""

import errno
import socket
import struct

import pytest

from sandboxd.isolation.network.rtnl import NLMSG_ERROR, Rtnl


def ack(seq: int, code: int = 0) -> bytes:
    """An ``NLMSG_ERROR`` answer to request ``seq`` (``code`` 0: an acknowledgement)."""
    return struct.pack("IHHIIi", 20, NLMSG_ERROR, 0, seq, 0, code)


def test_answers_that_are_not_the_requests_ack_are_skipped() -> None:
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, kernel:
        rtnl = Rtnl(ours)
        other = struct.pack("IHHII", 16, 16, 0, 1, 0)  # some other message of seq 1
        kernel.send(other + ack(0))  # a stale ack, then (next datagram) ours
        kernel.send(ack(1))
        rtnl.request(16, 0, b"")
        assert kernel.recv(64)[:16] == struct.pack("IHHII", 16, 16, 0x5, 1, 0)
        kernel.send(ack(2, -errno.EEXIST))
        with pytest.raises(FileExistsError):
            rtnl.request(16, 0, b"")
