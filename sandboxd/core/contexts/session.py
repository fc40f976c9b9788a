"""jupyter_client's ``Session`` without the dates: the daemon's reads of a kernel's messages.

``Session.deserialize`` parses every ISO 8601 text of a message's two headers into a
``datetime`` (dateutil, a regular expression on each value): a quarter of the daemon's CPU per
warm ``run_code("1")`` (six messages), for dates the daemon never reads (its frames carry its
own clock's). This one checks the signature exactly as ``Session`` does (the key's HMAC over
the four parts, in constant time; a signature seen before refused) and leaves the headers as
the kernel wrote them.
"""

from hmac import compare_digest
from typing import Any, cast

import zmq
from jupyter_client.adapter import adapt
from jupyter_client.session import Session


class UndatedSession(Session):
    """A :class:`~jupyter_client.session.Session` whose :meth:`deserialize` leaves dates as
    text; used only by the channels' own reads (whole messages, copied, content unpacked)."""

    def deserialize(
        self, msg_list: list[bytes] | list[zmq.Frame], content: bool = True, copy: bool = True
    ) -> dict[str, Any]:
        """The message ``msg_list`` (``[HMAC, header, parent, metadata, content, *buffers]``);
        ``ValueError`` for a signature that is wrong or replayed, ``TypeError`` for fewer
        than five parts."""
        assert content and copy, "only the channels' reads, which take the defaults"
        msg_list = cast(list[bytes], msg_list)  # copied: bytes
        if len(msg_list) < 5:
            raise TypeError("malformed message, must have at least 5 elements")
        signature = msg_list[0]
        if signature in self.digest_history:
            raise ValueError(f"Duplicate Signature: {signature!r}")
        if not signature or not compare_digest(signature, self.sign(msg_list[1:5])):
            raise ValueError(f"Invalid Signature: {signature!r}")
        self._add_digest(signature)
        header = self.unpack(msg_list[1])
        message = {
            "header": header,
            "msg_id": header["msg_id"],
            "msg_type": header["msg_type"],
            "parent_header": self.unpack(msg_list[2]),
            "metadata": self.unpack(msg_list[3]),
            "content": self.unpack(msg_list[4]),
            "buffers": [memoryview(part) for part in msg_list[5:]],
        }
        adapted: dict[str, Any] = adapt(message)
        return adapted
