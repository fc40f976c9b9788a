"""The daemon's reads of a kernel's messages (sandboxd/core/contexts/session.py): jupyter_client's
own signing ``Session`` writes them, the undated one reads them, and refuses what
``Session`` refuses."""

import pytest
from jupyter_client.session import Session

from sandboxd.core.contexts.session import UndatedSession

KEY = b"k" * 32


def written(**content: object) -> list[bytes]:
    """A signed ``stream`` message as a kernel sends it: the parts after ``<IDS|MSG>``."""
    writer = Session(key=KEY)
    parent = writer.msg_header("execute_request")
    parts = writer.serialize(writer.msg("stream", content, parent=parent))
    return [bytes(part) for part in parts[parts.index(b"<IDS|MSG>") + 1 :]]


def test_a_signed_message_reads_as_session_reads_it_but_its_dates() -> None:
    parts = written(name="stdout", text="hi\n")
    ours = UndatedSession(key=KEY).deserialize(parts)
    theirs = Session(key=KEY).deserialize(parts)
    assert ours["content"] == theirs["content"] == {"name": "stdout", "text": "hi\n"}
    assert (ours["msg_type"], ours["msg_id"]) == (theirs["msg_type"], theirs["msg_id"])
    assert ours["parent_header"]["msg_id"] == theirs["parent_header"]["msg_id"]
    assert isinstance(ours["header"]["date"], str)  # left as the kernel wrote it
    assert ours["header"]["date"].startswith(str(theirs["header"]["date"].date()))


def test_what_session_refuses_is_refused() -> None:
    reader = UndatedSession(key=KEY)
    parts = written(name="stdout", text="x")
    reader.deserialize(parts)
    with pytest.raises(ValueError, match="Duplicate Signature"):
        reader.deserialize(parts)  # replayed
    tampered = written(name="stdout", text="x")
    tampered[4] = tampered[4].replace(b'"x"', b'"y"')
    with pytest.raises(ValueError, match="Invalid Signature"):
        reader.deserialize(tampered)
    with pytest.raises(ValueError, match="Invalid Signature"):
        reader.deserialize([b"", *written(name="stdout", text="z")[1:]])  # unsigned
    with pytest.raises(ValueError, match="Invalid Signature"):
        UndatedSession(key=b"another").deserialize(written(name="stdout", text="w"))
    with pytest.raises(TypeError, match="malformed"):
        reader.deserialize(written(name="stdout", text="v")[:4])
