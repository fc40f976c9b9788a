"""The languages of a sandbox made from a template, judged from its python's answer to the
probe (docs/extensions.rst, "Contexts"). The probe run inside a template's sandbox is
tested for real in tests/e2b/test_interpreter_template.py (a template without python) and
tests/templates/test_templates_code_interpreter.py (the recipe's template)."""

import subprocess

from sandboxd.core.contexts.languages import LANGUAGES, PROBE
from sandboxd.core.contexts.template_kernels import TEMPLATE_HINT, judged, parsed

WHERE = "/usr/bin/python3 in template 't'"


def test_a_real_answer_gives_the_languages_it_names() -> None:
    modules = sorted({need for lang in LANGUAGES.values() for need in lang.needs} - {"bash"})
    answer = subprocess.run(
        ["/usr/bin/python3", "-c", PROBE, *modules], capture_output=True, check=True, timeout=60
    ).stdout
    kernels = judged(WHERE, parsed(answer))
    assert kernels.languages == ("python", "bash")  # the host's python has ipykernel, bash
    assert kernels.missing == {}


def test_what_is_missing_is_named_with_the_template_and_the_recipe() -> None:
    kernels = judged(WHERE, {"ipykernel": True, "bash": False})
    assert kernels.languages == ("python",)
    assert kernels.missing == {"bash": f"{WHERE} has no bash: {TEMPLATE_HINT}"}
    nothing = judged(WHERE, {})
    assert nothing.languages == ()
    assert nothing.missing["python"] == f"{WHERE} has no ipykernel: {TEMPLATE_HINT}"
    assert "'code-interpreter'" in TEMPLATE_HINT


def test_only_true_counts_as_found() -> None:
    assert judged(WHERE, {"ipykernel": "yes", "bash": 1}).languages == ()


def test_an_answer_that_is_no_json_object_finds_nothing() -> None:
    assert parsed(b"not json") == {}
    assert parsed(b"[true]") == {}
    assert parsed(b'{"ipykernel": true}\n') == {"ipykernel": True}
