"""What a template build reports as it goes (docs/extensions.rst, "Building a template"): each
step's start, each line its commands write, then its end, built or failed. Values of the core:
the HTTP front writes each as an NDJSON frame (``sandboxd.http.wire.build``)."""

from attrs import frozen

from sandboxd.core.templates.store import Template


@frozen
class StepStarted:
    """Step ``step`` of ``steps`` starts: the Dockerfile's ``line`` and its ``instruction``."""

    step: int
    steps: int
    line: int
    instruction: str


@frozen
class StepOutput:
    """One line the step's commands wrote (stdout or stderr; a long one cut in pieces)."""

    step: int
    output: str


@frozen
class Built:
    """The build's end: every step passed, ``template`` in place."""

    template: Template


@frozen
class BuildFailed:
    """The build's end: step ``step`` (its ``line`` and ``instruction``) did not pass, for
    ``error``; ``output`` its last lines; ``exit_code`` a ``RUN``'s (``None`` for any other
    step, or a build stopped before its command exited)."""

    step: int
    line: int
    instruction: str
    error: str
    output: tuple[str, ...]
    exit_code: int | None = None


BuildEvent = StepStarted | StepOutput | Built | BuildFailed
