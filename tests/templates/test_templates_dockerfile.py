"""The Dockerfile subset a build reads (docs/extensions.rst, "Building a template"): what each
instruction's arguments become, and every refusal naming its line."""

import pytest

from sandboxd.core.templates.dockerfile import (
    copy_paths,
    env_pairs,
    from_name,
    parse_dockerfile,
    run_argv,
    workdir_path,
)
from sandboxd.errors import BadRequest


def test_comments_blank_lines_and_continuations_are_read_as_docker_does() -> None:
    steps = parse_dockerfile(
        "# syntax\n\nfrom base:1\nRUN echo a \\\n  # inside\n\n  && echo b\nenv A=1\nRUN x \\\n"
    )
    assert [(s.instruction, s.arguments, s.line) for s in steps] == [
        ("FROM", "base:1", 3),
        ("RUN", "echo a && echo b", 4),
        ("ENV", "A=1", 8),
        ("RUN", "x", 9),
    ]
    assert steps[1].text == "RUN echo a && echo b"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Dockerfile: the first instruction must be FROM"),
        ("RUN true\n", "Dockerfile: the first instruction must be FROM"),
        ("FROM a\nFROM b\n", "Dockerfile line 2: only one FROM is supported"),
        ("FROM a\n\nEXPOSE 80\n", "Dockerfile line 3: instruction EXPOSE is not supported"),
        ("FROM a\nRUN\n", "Dockerfile line 2: RUN needs arguments"),
        ("FROM a AS b\n", "Dockerfile line 1: FROM takes one name"),
        ("FROM --platform=x a\n", "Dockerfile line 1: FROM takes one name"),
        ("FROM a\nRUN [1]\n", "Dockerfile line 2: RUN's exec form must be"),
        ("FROM a\nRUN [nope\n", "Dockerfile line 2: RUN's exec form must be"),
        ("FROM a\nRUN --mount=x true\n", "Dockerfile line 2: RUN takes no flags"),
        ("FROM a\nCOPY --from=b x y\n", "Dockerfile line 2: COPY takes no flags"),
        ("FROM a\nCOPY x\n", "Dockerfile line 2: COPY needs a source and a destination"),
        ('FROM a\nCOPY ["x", 1]\n', "Dockerfile line 2: COPY's JSON form must be"),
        ("FROM a\nCOPY [x\n", "Dockerfile line 2: COPY's JSON form must be"),
        ("FROM a\nENV A\n", "Dockerfile line 2: ENV needs KEY=value or KEY value"),
        ("FROM a\nENV A=1 B\n", "Dockerfile line 2: ENV: 'B' is not KEY=value"),
        ("FROM a\nENV A='x\n", "Dockerfile line 2: ENV: No closing quotation"),
        ("FROM a\nWORKDIR a b\n", "Dockerfile line 2: WORKDIR takes one path"),
    ],
)
def test_what_the_builder_cannot_follow_is_refused_naming_its_line(text: str, message: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_dockerfile(text)
    assert str(refused.value).startswith(message)


def test_each_instructions_arguments() -> None:
    steps = parse_dockerfile(
        "FROM debian:bookworm\n"
        'RUN ["/bin/echo", "hi"]\n'
        "RUN echo $HOME\n"
        "COPY a b /dest/\n"
        'COPY ["with space", "/d"]\n'
        'ENV A=1 B="two words"\n'
        "ENV C  some value\n"
        "WORKDIR rel\n"
    )
    assert from_name(steps[0]) == "debian:bookworm"
    assert run_argv(steps[1]) == ["/bin/echo", "hi"]
    assert run_argv(steps[2]) == ["/bin/sh", "-c", "echo $HOME"]
    assert copy_paths(steps[3]) == (["a", "b"], "/dest/")
    assert copy_paths(steps[4]) == (["with space"], "/d")
    assert env_pairs(steps[5]) == [("A", "1"), ("B", "two words")]
    assert env_pairs(steps[6]) == [("C", "some value")]
    assert workdir_path(steps[7]) == "rel"
