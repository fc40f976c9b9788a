"""Built-in recipes (docs/extensions.rst, "Built-in recipes"): the ``code-interpreter``
Dockerfile as the builder reads it, a build body's ``recipe`` made into its Dockerfile and
network, and the build route taking it (on the in-memory harness: no root, so the build
itself is refused after the recipe is read)."""

import json

import pytest

from sandboxd.core.templates import dockerfile
from sandboxd.core.templates.recipes import CODE_INTERPRETER, RECIPES
from sandboxd.errors import BadRequest
from sandboxd.http.parse import with_recipe
from tests.http.conftest import harness, settings, token  # noqa: F401 (fixtures)
from tests.http.http_harness import Harness, Reply


def test_the_code_interpreter_recipe_installs_the_kernels_from_debian() -> None:
    steps = dockerfile.parse_dockerfile(CODE_INTERPRETER.dockerfile)
    assert [step.instruction for step in steps] == ["FROM", "RUN"]
    assert dockerfile.from_name(steps[0]) == "debian:bookworm"
    [shell, flag, command] = dockerfile.run_argv(steps[1])
    assert (shell, flag) == ("/bin/sh", "-c")
    wanted = ("python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib")
    for package in (*wanted, "python3-munkres"):  # munkres: fonttools' alternative to SciPy
        assert f" {package} " in command
    assert "--no-install-recommends" in command
    assert command.endswith("rm -rf /var/lib/apt/lists/*")  # the lists do not stay
    assert CODE_INTERPRETER.network == "host"  # apt-get downloads
    assert RECIPES == {"code-interpreter": CODE_INTERPRETER}


def test_a_body_without_a_recipe_is_left_as_it_is() -> None:
    body = {"dockerfile": "FROM x\n", "network": "none"}
    assert with_recipe(body) == body


def test_a_recipe_gives_its_dockerfile_and_network() -> None:
    assert with_recipe({"recipe": "code-interpreter"}) == {
        "recipe": "code-interpreter",
        "dockerfile": CODE_INTERPRETER.dockerfile,
        "network": "host",
    }
    chosen = with_recipe({"recipe": "code-interpreter", "network": "none"})
    assert chosen["network"] == "none"  # the body's own wins


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"recipe": "nope"}, "recipe: 'nope' is not a recipe of this daemon (recipes: code-inter"),
        ({"recipe": 7}, "recipe: 7 is not a recipe of this daemon"),
        ({"recipe": "code-interpreter", "dockerfile": "FROM x"}, "recipe and dockerfile: give one"),
    ],
)
def test_a_recipe_that_cannot_be_taken_is_refused(body: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequest, match="^" + message.replace("(", r"\(")):
        with_recipe(body)


def build(harness: Harness, body: dict[str, object]) -> Reply:  # noqa: F811
    headers = {"Content-Type": "application/json"}
    return harness.call("POST", "/templates/ci/build", data=json.dumps(body), headers=headers)


def test_the_build_route_reads_a_recipe(harness: Harness) -> None:  # noqa: F811
    """An unknown recipe is refused before anything else; a known one reaches the builder,
    which this replica (not root) refuses as it would the Dockerfile sent as such."""
    unknown = build(harness, {"recipe": "nope"})
    assert unknown.error() == (400, "BadRequest")
    assert "'nope' is not a recipe" in unknown.json()["detail"]
    known = build(harness, {"recipe": "code-interpreter"})
    assert known.error() == (501, "NotImplemented")
    assert known.json()["detail"] == "template builds need a daemon running as root"
    none = build(harness, {})
    assert none.error() == (400, "BadRequest")
    assert none.json()["detail"] == "dockerfile: must be the Dockerfile's text"
