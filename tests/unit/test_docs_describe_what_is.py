"""README.md and docs/ describe what the software is, not how it got there.

A reader cannot follow "issue 16", "session 42", "December 6" or a design id that leads nowhere;
history lives in git. Scanned: the prose of README.md and docs/**/*.md. Allowed: fenced code blocks
and inline code spans (sample data, trace examples, timestamps in payloads), the product's own
sessions ("40 sessions", "a session's runs", `session_id`: only "session" directly followed by a
number is a work session), and design-rule ids ("D5.7") in docs/design.md, whose headings they are,
or elsewhere as a link to docs/design.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.docs_text import ROOT, links, prose_lines, user_docs

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a work session's number": re.compile(r"\bsessions? \d+\b", re.IGNORECASE),
    "a date": re.compile(rf"\b(?:{_MONTHS}) \d{{1,2}}\b|\b\d{{4}}-\d{{2}}-\d{{2}}\b"),
}
_DESIGN_ID = re.compile(r"\bD\d{1,2}(?:\.\d{1,2})?\b")


def findings(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for every forbidden reference in the prose of one Markdown file."""
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(root)
    found = [
        f"{where}:{number}: {what}: {match.group(0)!r}"
        for number, line in prose_lines(text)
        for what, pattern in FORBIDDEN.items()
        for match in pattern.finditer(line)
    ]
    if path.name == "design.md":
        return found
    linked: dict[int, int] = {}
    for number, link_text, target in links(text):
        if target.split("#")[0].endswith("design.md"):
            linked[number] = linked.get(number, 0) + len(_DESIGN_ID.findall(link_text))
    for number, line in prose_lines(text):
        if len(_DESIGN_ID.findall(line)) > linked.get(number, 0):
            found.append(f"{where}:{number}: a design id not linked to docs/design.md: {line.strip()!r}")
    return found


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_describe_what_is_without_issue_session_or_date_references(path: Path) -> None:
    assert findings(path) == []


def test_docs_describe_what_is_check_names_file_and_line_of_each_reference(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text(
        "# x\n\nMet issue 16's goal in session 42.\n\nDecember 6: faster (design D14.24).\n\n"
        "40 sessions, the session's runs, `session 7`, [design D5.7](design.md#d57).\n\n"
        "```\nDecember 6, issue 3\n```\n",
        encoding="utf-8",
    )
    got = findings(doc, root=tmp_path)
    assert got == [
        "docs/x.md:3: an issue number: 'issue 16'",
        "docs/x.md:3: a work session's number: 'session 42'",
        "docs/x.md:5: a date: 'December 6'",
        "docs/x.md:5: a design id not linked to docs/design.md: 'December 6: faster (design D14.24).'",
    ]
