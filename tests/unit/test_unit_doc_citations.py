"""Every reference the tree makes to its design is to a page of ``docs/`` that exists.

Code, comments, tests and packaging cite the project's own pages as ``docs/<page>.rst,
"<Section>"``; the section is a title of that page, so a renamed or removed section breaks this
test instead of leaving a reference nobody can follow. The design document the code once cited
lived outside the repository: no file may cite it again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist"})
"""Directories of generated or installed files (hidden ones, ``.git`` and ``.venv``
included, and ``*.egg-info``, are skipped too)."""

OUTSIDE_DOCUMENT = re.compile(r"\bS[P]EC(?:\.md\b|\s*(?:§|section\b|\d))")
"""A citation of the outside design document: its name before a section sign, the word
``section`` or a section number, or its file name."""

PAGE = re.compile(r"\bdocs/([\w-]+\.rst)\b")
CITATION = re.compile(r'\bdocs/([\w-]+\.rst)`{0,2},[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?"([^"\n]+)"')
"""``docs/<page>.rst, "<Section>"``, the page optionally an rst literal, the section possibly
on the next line (of a comment, too)."""

ADORNMENT = re.compile(r"""([=\-~^"'`*+#:.])\1{2,}""")


def text_files() -> Iterator[tuple[Path, str]]:
    """Every text file of the tree with its text (binary files are left out)."""
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")
        )
        for name in sorted(files):
            path = Path(top, name)
            try:
                yield path, path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue


def titles(text: str) -> set[str]:
    """The section titles of an rst page: each line underlined by a line of one punctuation
    character repeated, at least as long as the title (an overline changes nothing)."""
    lines = text.splitlines()
    found = set()
    for above, line in pairwise(lines):
        title = above.rstrip()
        if (
            title
            and not above[0].isspace()
            and ADORNMENT.fullmatch(line)
            and not ADORNMENT.fullmatch(title)
            and len(line) >= len(title)
        ):
            found.add(title)
    return found


def pages() -> dict[str, set[str]]:
    """Each page of ``docs/`` and its section titles."""
    return {page.name: titles(page.read_text(encoding="utf-8")) for page in DOCS.glob("*.rst")}


def where(path: Path, text: str, offset: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}"


def test_titles_of_a_page() -> None:
    page = "Title\n=====\n\nIntro.\n\nA section\n---------\n\n``code``\n~~~~~~~~~~\n\n  x\n  ---\n"
    assert titles(page) == {"Title", "A section", "``code``"}
    assert titles("Too long a title\n-----\n") == set()


def test_the_pages_have_their_sections() -> None:
    """The pages the code cites most are there, with the sections it names."""
    known = pages()
    assert {"Errors", "Routes", "The exec stream", "Bad input and faults"} <= known["contract.rst"]
    assert {"Background processes", "Workspace watch", "Auth"} <= known["extensions.rst"]
    assert {"Layout", "Namespaces", "Network modes"} <= known["isolation.rst"]
    assert {"Configuration", "Connections"} <= known["operating.rst"]


def test_no_file_cites_the_outside_document() -> None:
    found = [
        f"{where(path, text, m.start())}: {m.group(0)!r}"
        for path, text in text_files()
        for m in OUTSIDE_DOCUMENT.finditer(text)
    ]
    assert found == [], "cite a page of docs/ instead:\n" + "\n".join(found)


def test_every_cited_page_exists() -> None:
    known = pages()
    missing = [
        f"{where(path, text, m.start())}: docs/{m.group(1)}"
        for path, text in text_files()
        for m in PAGE.finditer(text)
        if m.group(1) not in known
    ]
    assert missing == []


def test_every_cited_section_exists() -> None:
    known = pages()
    cited = [
        (where(path, text, m.start()), m.group(1), m.group(2))
        for path, text in text_files()
        for m in CITATION.finditer(text)
    ]
    assert cited, "the tree cites no section: the pattern no longer matches the citations"
    missing = [
        f"{place}: docs/{page}, {section!r}"
        for place, page, section in cited
        if section not in known.get(page, set())
    ]
    assert missing == []


@pytest.mark.parametrize(
    "text",
    [
        "See S" + "PEC §3.",
        "(S" + "PEC section 2, live stderr)",
        "background processes (S" + "PEC 2.1)",
        "/work/shared/S" + "PEC.md",
    ],
)
def test_outside_citations_are_recognised(text: str) -> None:
    assert OUTSIDE_DOCUMENT.search(text)


@pytest.mark.parametrize(
    "text", ["SPECIAL[]", "KEY_SPEC_SESSION_KEYRING", "FILE_TYPE_UNSPECIFIED", "SPEC = load()"]
)
def test_other_words_are_not_citations(text: str) -> None:
    assert not OUTSIDE_DOCUMENT.search(text)
