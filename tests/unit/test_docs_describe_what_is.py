"""README.md, docs/ and the code describe what the software is, not how it got there.

A reader cannot follow an issue's number, a work session's number, a date or a design-decision number
("D5.7"); history lives in git, and docs/design.md's sections are named, so the code and the other
documents cite them by name. One matcher (``FORBIDDEN``) for both.

Docs: the prose of README.md and docs/**/*.md. Allowed: fenced code blocks and inline code spans
(sample data, trace examples, timestamps in payloads), and the product's own sessions ("40 sessions",
"a session's runs", `session_id`: only "session" directly followed by a number is a work session).

Code: every line of every text file in ``CODE`` (comments, docstrings and strings alike, Python, SQL,
YAML, Makefile …). Allowed: the data and vendored files of ``ALLOWED_PATHS``, and the single values of
``ALLOWED_TEXT`` that are data in a test's input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.unit.docs_text import ROOT, prose_lines, user_docs

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_MONTHS_SHORT = r"(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.?"

FORBIDDEN = {
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a work session's number": re.compile(r"\bsessions? #?\d+\b", re.IGNORECASE),
    # A month's name and a day or a year (also abbreviated, with or without a dot), or an ISO date.
    "a date": re.compile(
        rf"\b(?:{_MONTHS}|{_MONTHS_SHORT}) (?:\d{{1,2}}|\d{{4}})\b|\b\d{{4}}-\d{{2}}-\d{{2}}\b"
    ),
    # "D", a chapter number, a dot and a section number; or a chapter named "design D" and its number.
    "a design-decision id": re.compile(r"\bD\d{1,2}\.\d{1,2}\b|\bdesign D\d{1,2}\b(?!\.\d)"),
}


def _references(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str, str]]:
    """(line number, what, matched text) of every forbidden reference in the numbered lines."""
    for number, line in lines:
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(line):
                yield number, what, match.group(0)


def findings(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for every forbidden reference in the prose of one Markdown file."""
    where = path.relative_to(root).as_posix()
    lines = prose_lines(path.read_text(encoding="utf-8"))
    return [f"{where}:{number}: {what}: {match!r}" for number, what, match in _references(lines)]


# The words the examples below put before a number, kept apart so this file does not match itself.
ISSUE, SESSION, MONTH = "issue", "session", "December"


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_describe_what_is_without_issue_session_or_date_references(path: Path) -> None:
    assert findings(path) == []


def test_docs_describe_what_is_check_names_file_and_line_of_each_reference(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text(
        f"# x\n\nMet {ISSUE} 16's goal in {SESSION} 42.\n\n{MONTH} 6: faster (design D{14}.24).\n\n"
        f"40 sessions, the session's runs, `{SESSION} 7`, [design D5.7](design.md#d57), `D{5}.7`.\n\n"
        f"```\n{MONTH} 6, {ISSUE} 3, D{5}.7\n```\n\n"
        f"## Later\n\nAs D{14}.17 says, in {SESSION} 9.\n",
        encoding="utf-8",
    )
    got = findings(doc, root=tmp_path)
    assert got == [
        f"docs/x.md:3: an issue number: '{ISSUE} 16'",
        f"docs/x.md:3: a work session's number: '{SESSION} 42'",
        f"docs/x.md:5: a date: '{MONTH} 6'",
        f"docs/x.md:5: a design-decision id: 'D{14}.24'",
        f"docs/x.md:7: a design-decision id: 'D{5}.7'",
        f"docs/x.md:15: a work session's number: '{SESSION} 9'",
        f"docs/x.md:15: a design-decision id: 'D{14}.17'",
    ]


# The code, scanned line by line; a folder is scanned whole but for hidden folders, caches and
# installed packages (``_NOT_SOURCE``): what a checkout holds besides its own files.
CODE = (
    "contracts",
    "services",
    "workers",
    "infra",
    "benchmarks",
    "tests",
    "k8s",
    "clients/typescript",
    ".ci",
    "Makefile",
    "pyproject.toml",
    "Containerfile",
)
_NOT_SOURCE = {"__pycache__", "node_modules"}
# Files whose dates are their content, or that are someone else's text: path (a file, or a folder and
# everything under it) → why.
ALLOWED_PATHS = {
    "infra/samples": "recorded agent traces, replayed as the bundled samples: their timestamps are data",
    "tests/golden": "golden outputs, compared byte for byte",
    "k8s/crds": "CRD schemas vendored from their projects (k8s/crds/SOURCES.md)",
    "tests/schemas": "the AsyncAPI specification, vendored with its licence",
    "tests/node/package-lock.json": "npm's generated lock file",
    "clients/typescript/package-lock.json": "npm's generated lock file",
    "tests/unit/test_docs_describe_what_is.py": "this check's own examples of what it finds",
}
# Single values that are data in a test's input, per file.
ALLOWED_TEXT = {
    "tests/unit/test_wire_agreement.py": {"2026-01-31"},  # times the wire must refuse
    "tests/unit/test_structured_summary.py": {"2024-05-17"},  # a tool's output in a sample
}


def _within(where: str, allowed: Iterable[str]) -> bool:
    return any(where == a or where.startswith(f"{a}/") for a in allowed)


def _allowed_path(where: str) -> bool:
    return _within(where, ALLOWED_PATHS)


def code_files(name: str, root: Path = ROOT) -> list[Path]:
    """The text files of one entry of ``CODE`` (a folder or a file), the allowed paths left out."""
    top = root / name
    candidates = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
    files = []
    for path in candidates:
        where = path.relative_to(root)
        folders = where.parts[:-1]
        if any(part in _NOT_SOURCE or (part.startswith(".") and part != ".ci") for part in folders):
            continue
        if not _allowed_path(where.as_posix()):
            files.append(path)
    return files


def code_findings(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: what`` for every forbidden reference on any line of one text file (none in binaries)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []
    if "\0" in text:
        return []
    where = path.relative_to(root).as_posix()
    allowed = ALLOWED_TEXT.get(where, set())
    numbered = enumerate(text.splitlines(), start=1)
    return [
        f"{where}:{number}: {what}: {found!r}"
        for number, what, found in _references(numbered)
        if found not in allowed
    ]


@pytest.mark.parametrize("name", CODE)
def test_code_describes_what_is_without_issue_session_or_date_references(name: str) -> None:
    assert [line for path in code_files(name) for line in code_findings(path)] == []


def test_code_describes_what_is_allowances_name_what_exists() -> None:
    missing = [where for where in ALLOWED_PATHS if not (ROOT / where).exists()]
    missing += [
        f"{where}: {text}"
        for where, texts in ALLOWED_TEXT.items()
        for text in texts
        if text not in (ROOT / where).read_text(encoding="utf-8")
    ]
    assert missing == []


def test_code_describes_what_is_check_names_file_and_line_of_each_reference(tmp_path: Path) -> None:
    code = tmp_path / "services" / "x.py"
    code.parent.mkdir()
    code.write_text(
        f'"""Faster since {MONTH} 6 ({ISSUE} #16).\n\nsession_id names one of 40 sessions."""\n'
        f"# measured in {SESSION} 42, Dec. 3\n"
        f'WHEN = "2026-12-06"  # until {MONTH} 2026\n'
        f"# as design D{3} and D{14}.21 say; a D{3} row, DD{1}.2\n",
        encoding="utf-8",
    )
    (tmp_path / "services" / "blob.bin").write_bytes(b"\0" + ISSUE.encode() + b" 16\xff")
    for skipped in ("__pycache__", ".cache", "node_modules"):
        (tmp_path / "services" / skipped).mkdir()
        (tmp_path / "services" / skipped / "y.py").write_text(f"# {ISSUE} 16\n", encoding="utf-8")
    samples = tmp_path / "infra" / "samples"
    samples.mkdir(parents=True)
    (samples / "trace.jsonl").write_text('{"day": "2026-12-06"}\n', encoding="utf-8")
    got = [
        line
        for name in ("services", "infra")
        for path in code_files(name, root=tmp_path)
        for line in code_findings(path, root=tmp_path)
    ]
    assert got == [
        "services/x.py:1: an issue number: 'issue #16'",
        f"services/x.py:1: a date: '{MONTH} 6'",
        f"services/x.py:4: a work session's number: '{SESSION} 42'",
        "services/x.py:4: a date: 'Dec. 3'",
        "services/x.py:5: a date: '2026-12-06'",
        f"services/x.py:5: a date: '{MONTH} 2026'",
        f"services/x.py:6: a design-decision id: 'design D{3}'",
        f"services/x.py:6: a design-decision id: 'D{14}.21'",
    ]
