"""The client's interpreter contexts, round trip, against the real daemon and a real kernel
(docs/extensions.rst, "Contexts")."""

from __future__ import annotations

import pytest
import pytest_twisted

from sandboxd_client import ContextNotFound, HttpSandbox
from sandboxd_client._contexts import CellDecoder, ContextInfo, _listing
from sandboxd_client._types import ProtocolError

from .real_daemon import daemon_and_client

TOKEN = "contexts-token"

daemon, client = daemon_and_client(TOKEN)


@pytest_twisted.ensureDeferred
async def test_contexts_round_trip(client: HttpSandbox) -> None:
    handle = await client.create()
    context = await client.create_context(handle)
    assert context.language == "python"
    assert await client.contexts(handle) == [context]
    said: list[str] = []
    first = await client.run_code(handle, context.id, "x = 20\nprint('hi')", on_stdout=said.append)
    assert said == ["hi\n"] and first.stdout == ["hi\n"] and first.text is None
    second = await client.run_code(
        handle, context.id, "import os\nx * 2, os.environ['E']", env={"E": "e"}
    )
    assert second.text == "(40, 'e')" and second.execution_count == 2
    failed = await client.run_code(
        handle, context.id, "import sys\nprint('w', file=sys.stderr)\n1/0", on_stderr=said.append
    )
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert failed.stderr == ["w\n"] and said[-1] == "w\n"
    interrupted = await client.run_code(handle, context.id, "while True: pass", timeout=1)
    assert interrupted.error is not None and interrupted.error.name == "KeyboardInterrupt"
    await client.restart_context(handle, context.id)
    assert (await client.run_code(handle, context.id, "'x' in dir()")).text == "False"
    await client.remove_context(handle, context.id)
    with pytest.raises(ContextNotFound):
        await client.run_code(handle, context.id, "1")
    await client.kill(handle)


@pytest_twisted.ensureDeferred
async def test_a_bash_context(client: HttpSandbox) -> None:
    handle = await client.create()
    context = await client.create_context(handle, language="bash")
    assert context.language == "bash"
    await client.run_code(handle, context.id, "n=7")
    shown = await client.run_code(
        handle, context.id, 'echo "$n"; echo w >&2; exit_with() { return $1; }'
    )
    assert "".join(shown.stdout) == "7\n" and "".join(shown.stderr) == "w\n"
    failed = await client.run_code(handle, context.id, "exit_with 5")
    assert failed.error is not None and (failed.error.name, failed.error.value) == ("", "5")
    await client.kill(handle)


def test_replies_that_are_not_contexts_are_protocol_errors() -> None:
    assert _listing([{"id": "a", "language": "python", "cwd": "/w"}]) == [
        ContextInfo("a", "python", "/w")
    ]
    for reply in ({"id": "a"}, [{"id": 1, "language": "python", "cwd": "/"}]):
        with pytest.raises(ProtocolError):
            _listing(reply)


def test_the_decoder_refuses_garbage_and_a_cut_stream() -> None:
    decoder = CellDecoder(None, None)
    with pytest.raises(ProtocolError):
        decoder.feed(b"[]\n")
    decoder.feed(b'{"type": "result", "is_main_result": false, "data": {"text/plain": "1"}}\n{}\n')
    assert decoder.execution.results == [{"text/plain": "1"}] and not decoder.ended
    assert decoder.execution.main_result is None
