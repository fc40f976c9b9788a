"""Schemathesis hooks for fuzzing a live daemon (``SCHEMATHESIS_HOOKS=fuzz_hooks``).

* ``{rid}``: a generated id of the documented shape is replaced by a live sandbox's id
  (``SANDBOXD_FUZZ_RIDS``), so the file and exec operations reach a real workspace instead of
  all answering ``404 SandboxNotFound``. Ids of any other shape are sent as generated. Kill is
  left alone (it would remove the sandboxes the others use).
* ``exec``: a generated ``cmd`` made of strings runs as arguments of ``/bin/echo``: every
  field still reaches the daemon's validation and the command is really started, but random
  argv never runs as a program (the daemon runs as root in CI).
* ``processes``: a started command runs as arguments of ``/bin/echo`` too; a generated
  process ``{process_id}`` is replaced by a live one (``SANDBOXD_FUZZ_PROCESSES``, ``rid:id`` pairs
  of ``sleep`` processes the test started), and ``output`` never follows (a following read of
  a running process is a stream without end).
* ``/tools/resolve``: manifest URLs that the daemon would fetch point at a closed local port.
* ``application/x-ndjson`` (the exec stream): every line must be one JSON object, every line
  but the last an output frame ``{"o": ...}`` (or ``{"e": ...}`` when the request asked for
  ``"split": true``), the last an exit or error frame; the last frame
  is what schemathesis then validates against the documented ``ExecFrame`` schema.
"""

import io
import json
import os
import re
import tarfile
from typing import Any

import schemathesis
from hypothesis import strategies as st

RID = re.compile(r"^[0-9a-f]{16}$")
LIVE = [rid for rid in os.environ.get("SANDBOXD_FUZZ_RIDS", "").split(",") if rid]
CLOSED_PORT_URL = "http://127.0.0.1:9/manifest.json"
PROCESSES = dict(
    pair.split(":", 1) for pair in os.environ.get("SANDBOXD_FUZZ_PROCESSES", "").split(",") if pair
)


def tar_of(*members: tuple[str, bytes]) -> bytes:
    """A tar holding ``members`` (name, bytes) as regular files."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# A tree upload's body: a tar (one that lands, one naming a path outside) or any bytes.
schemathesis.openapi.media_type(
    "application/x-tar",
    st.one_of(
        st.sampled_from([tar_of(("a/b.txt", b"b")), tar_of(("../outside", b"x"))]),
        st.binary(max_size=4096),
    ),
)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: Any) -> None:
    path = case.operation.path
    parameters = case.path_parameters or {}
    rid = parameters.get("rid")
    if LIVE and isinstance(rid, str) and RID.match(rid) and path != "/sandboxes/{rid}":
        parameters["rid"] = LIVE[int(rid, 16) % len(LIVE)]
    if "{process_id}" in path and parameters.get("rid") in PROCESSES:
        parameters["process_id"] = PROCESSES[parameters["rid"]]
    if path.endswith("/output"):
        case.query = {**(case.query or {}), "follow": "false"}
    body = case.body
    if (path.endswith("/exec") or path.endswith("/processes")) and isinstance(body, dict):
        cmd = body.get("cmd")
        if isinstance(cmd, list) and cmd and all(isinstance(arg, str) for arg in cmd):
            body["cmd"] = ["/bin/echo", *cmd]
    if path == "/tools/resolve" and isinstance(body, dict):
        tools = body.get("tools")
        if isinstance(tools, dict):
            for name, url in tools.items():
                if isinstance(url, str) and "://" in url:
                    tools[name] = CLOSED_PORT_URL


@schemathesis.deserializer("application/x-ndjson")
def exec_stream(context: Any, response: Any) -> Any:
    lines = response.content.splitlines()
    frames = [json.loads(line) for line in lines]
    # Schemathesis 4's response has no url of its own: its request has.
    request = getattr(response, "request", None)
    url = str(getattr(request, "url", "") or getattr(response, "url", ""))
    if "/processes/" in url or (frames and "at" in frames[0]):
        return process_stream(frames)
    if not lines:
        raise ValueError("an exec stream without frames")
    # Live frames: {"o"} always, {"e"} only with `split: true` (docs/extensions.rst, "Live stderr").
    live = [{"o"}, {"e"}] if asked_split(request) else [{"o"}]
    for frame in frames[:-1]:
        if not (isinstance(frame, dict) and set(frame) in live):
            raise ValueError(f"not an output frame before the last one: {frame!r}")
    last = frames[-1]
    if not (isinstance(last, dict) and ("exit" in last or "error" in last)):
        raise ValueError(f"the stream does not end with an exit or error frame: {last!r}")
    return last


def asked_split(request: Any) -> bool:
    """True when the exec request's JSON body holds ``"split": true``."""
    try:
        body = json.loads(getattr(request, "body", None) or b"")
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("split") is True


def process_stream(frames: list[Any]) -> Any:
    """A process output stream: objects only, an exit or error frame only last; the last
    frame is what schemathesis validates (``{}`` for an empty read of a running process)."""
    for frame in frames[:-1]:
        if not isinstance(frame, dict) or "exit" in frame or "error" in frame:
            raise ValueError(f"an end frame before the last one: {frame!r}")
    return frames[-1] if frames else {}
