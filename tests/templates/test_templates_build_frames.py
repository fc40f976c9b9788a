"""A build's events as NDJSON frames (``sandboxd.http.wire.build``; docs/extensions.rst,
"Building a template"): the bytes of each, keys in the documented order."""

from sandboxd.core import BuildFailed, Built, StepOutput, StepStarted, Template
from sandboxd.http.wire.build import build_frame


def test_a_steps_start_and_its_output() -> None:
    assert build_frame(StepStarted(2, 5, 7, "RUN echo hi")) == (
        b'{"step":2,"steps":5,"line":7,"instruction":"RUN echo hi"}\n'
    )
    assert build_frame(StepOutput(2, 'a "quoted" line')) == (
        b'{"step":2,"output":"a \\"quoted\\" line"}\n'
    )


def test_the_end_built_carries_the_templates_record() -> None:
    template = Template("app", "sha256:ab", 13, {"A": "1"}, "/srv", 1750000000.5)
    assert build_frame(Built(template)) == (
        b'{"end":"built","template":{"name":"app","digest":"sha256:ab","size":13,'
        b'"env":{"A":"1"},"workdir":"/srv","created":1750000000.5}}\n'
    )


def test_the_end_failed_has_an_exit_code_for_a_run_only() -> None:
    run = BuildFailed(2, 3, "RUN false", "the command exited with 1", ("out",), 1)
    assert build_frame(run) == (
        b'{"end":"failed","step":2,"line":3,"instruction":"RUN false",'
        b'"error":"the command exited with 1","output":["out"],"exit_code":1}\n'
    )
    copy = BuildFailed(1, 1, "COPY a /b", "COPY needs a context", ())
    assert build_frame(copy) == (
        b'{"end":"failed","step":1,"line":1,"instruction":"COPY a /b",'
        b'"error":"COPY needs a context","output":[]}\n'
    )
