"""The NDJSON frames of a template build (docs/extensions.rst, "Building a template"): one line
per event of the core's build (``sandboxd.core`` ``BuildEvent``)."""

from typing import Any

from sandboxd.core import BuildEvent, BuildFailed, Built, StepOutput, StepStarted
from sandboxd.http.wire.bodies import template_body
from sandboxd.http.wire.frames import frame_line


def build_frame(event: BuildEvent) -> bytes:
    """``{step, steps, line, instruction}`` as a step starts, ``{step, output}`` for a line of
    its output, then ``{end: "built", template}`` or ``{end: "failed", step, line,
    instruction, error, output, exit_code?}``."""
    frame: dict[str, Any]
    if isinstance(event, StepStarted):
        frame = {
            "step": event.step,
            "steps": event.steps,
            "line": event.line,
            "instruction": event.instruction,
        }
    elif isinstance(event, StepOutput):
        frame = {"step": event.step, "output": event.output}
    elif isinstance(event, Built):
        frame = {"end": "built", "template": template_body(event.template)}
    else:
        frame = failed_frame(event)
    return frame_line(frame)


def failed_frame(event: BuildFailed) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "end": "failed",
        "step": event.step,
        "line": event.line,
        "instruction": event.instruction,
        "error": event.error,
        "output": list(event.output),
    }
    if event.exit_code is not None:
        frame["exit_code"] = event.exit_code
    return frame
