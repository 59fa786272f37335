"""Every relative link in README.md and docs/ leads somewhere: an existing file, and the heading an
anchor names when it points into a Markdown file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.docs_text import ROOT, anchors, links, user_docs

_EXTERNAL = ("http://", "https://", "mailto:")


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: target (why)`` for each relative link of one Markdown file that leads nowhere."""
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(root)
    broken = []
    for number, _, target in links(text):
        if target.startswith(_EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{where}:{number}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{where}:{number}: {target} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_links_lead_to_existing_files_and_headings(path: Path) -> None:
    assert broken_links(path) == []


def test_docs_links_check_names_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A 3-node cluster (R3)\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n[ok](other.md#a-3-node-cluster-r3) [self](#doc) [web](https://example.com/x)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere)\n\n```\n[in code](absent.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(doc, root=tmp_path) == [
        "doc.md:4: missing.md (no such file)",
        "doc.md:4: other.md#nowhere (no heading with that anchor)",
    ]
