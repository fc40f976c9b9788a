"""Every page of the project's documentation renders: docutils reports no error (a malformed
table, a broken directive) in README.rst or any page of docs/."""

from pathlib import Path

import docutils.core
import docutils.utils
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.rst", *sorted((ROOT / "docs").glob("*.rst"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_page_renders_without_errors(page: Path) -> None:
    settings = {"report_level": 5, "halt_level": 5, "warning_stream": False}
    document = docutils.core.publish_doctree(page.read_text(), settings_overrides=settings)
    errors = [
        node.astext()
        for node in document.findall(docutils.nodes.system_message)
        if node["level"] >= docutils.utils.Reporter.ERROR_LEVEL
    ]
    assert errors == []
