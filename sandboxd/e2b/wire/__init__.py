"""The E2B front's wire: every body and frame it sends, and the parsing of what it receives.

Connect-RPC with the JSON codec (the only one the SDK uses): a unary call's body is one bare
JSON object; a stream's body is a run of *envelopes* (one flag byte, a 4-byte big-endian
length, that many bytes of JSON), the last one flagged end-of-stream (``0x02``) and holding
``{}`` or ``{"error": {...}}``. Errors of unary calls are a non-200 status with a Connect error
body ``{"code": "<code>", "message": "..."}``. The control plane (REST) answers errors as
``{"code": <int status>, "message": "..."}``, which is what the SDK's generated client needs.

Core errors become Connect codes and REST statuses in one table searched along the class
hierarchy, :data:`ERROR_ANSWERS`.

The wire is a package, one module per kind: :mod:`~sandboxd.e2b.wire.errors` (the exceptions
and the error table), :mod:`~sandboxd.e2b.wire.connect` (messages, envelopes, fields, process
events), :mod:`~sandboxd.e2b.wire.answers` (error bodies and the channel's whole answers) and
:mod:`~sandboxd.e2b.wire.rest` (control-plane bodies), :mod:`~sandboxd.e2b.wire.interpreter` (the
code interpreter's frames). The routes use them through this
package: ``wire.<name>``.
"""

from sandboxd.e2b.wire.answers import (
    absent_answer,
    connect_error_body,
    refused_answer,
    rest_answer,
    rest_error_body,
)
from sandboxd.e2b.wire.connect import (
    CONNECT_JSON,
    FLAG_COMPRESSED,
    FLAG_END,
    HEADER,
    MESSAGE_MAX,
    PROCESS_KEEPALIVE,
    RPC_PREFIXES,
    STREAM_PATHS,
    WATCH_KEEPALIVE,
    WATCH_START,
    b64,
    body,
    bool_field,
    data_event,
    end_event,
    end_of_stream,
    envelope,
    first_message,
    int_field,
    object_field,
    parse_message,
    read_envelopes,
    start_event,
    text_field,
    unb64,
)
from sandboxd.e2b.wire.errors import (
    ERROR_ANSWERS,
    STATUS_OF_CODE,
    ConnectError,
    ErrorAnswer,
    RestError,
    answer_of,
    connect_error_of,
    error_json,
    events_dropped,
    no_sandbox_named,
    not_running,
)
from sandboxd.e2b.wire.interpreter import (
    INTERPRETER_KEEPALIVE,
    MIME_KEYS,
    interpreter_frame,
    result_fields,
)
from sandboxd.e2b.wire.rest import (
    CLIENT_ID,
    ENVD_VERSION,
    detail_json,
    sandbox_json,
)
from sandboxd.web.answers import JSON

__all__ = [
    "CLIENT_ID",
    "CONNECT_JSON",
    "ENVD_VERSION",
    "ERROR_ANSWERS",
    "FLAG_COMPRESSED",
    "FLAG_END",
    "HEADER",
    "INTERPRETER_KEEPALIVE",
    "JSON",
    "MESSAGE_MAX",
    "MIME_KEYS",
    "PROCESS_KEEPALIVE",
    "RPC_PREFIXES",
    "STATUS_OF_CODE",
    "STREAM_PATHS",
    "WATCH_KEEPALIVE",
    "WATCH_START",
    "ConnectError",
    "ErrorAnswer",
    "RestError",
    "absent_answer",
    "answer_of",
    "b64",
    "body",
    "bool_field",
    "connect_error_body",
    "connect_error_of",
    "data_event",
    "detail_json",
    "end_event",
    "end_of_stream",
    "envelope",
    "error_json",
    "events_dropped",
    "first_message",
    "int_field",
    "interpreter_frame",
    "no_sandbox_named",
    "not_running",
    "object_field",
    "parse_message",
    "read_envelopes",
    "refused_answer",
    "rest_answer",
    "rest_error_body",
    "result_fields",
    "sandbox_json",
    "start_event",
    "text_field",
    "unb64",
]
