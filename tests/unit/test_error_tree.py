"""The tree drawn in ``contracts/exceptions.py``'s docstring is the class hierarchy: every error class once,
under its real parent, so the drawing cannot drift from the code."""

from __future__ import annotations

import re

import contracts.exceptions as errors_module
from contracts.exceptions import CtxError

# One drawn class per line: the root at the margin, or the tree's glyphs ending in a branch, then the
# class name, four columns a level; a line without a branch continues the comment above it.
_DRAWN = re.compile(r"^(?P<indent>(?:(?:[│ ] {3})*[├└]── )?)(?P<name>[A-Z]\w*)")


def drawn_tree(docstring: str) -> list[tuple[str, str | None]]:
    """(class, parent) of each class drawn in the docstring's tree, top to bottom; None for the root."""
    block = docstring.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    parents: list[str] = []
    drawn: list[tuple[str, str | None]] = []
    for line in block.splitlines():
        match = _DRAWN.match(line.removeprefix("    "))
        if match is None:
            continue
        depth = len(match.group("indent")) // 4
        del parents[depth:]
        drawn.append((match.group("name"), parents[-1] if parents else None))
        parents.append(match.group("name"))
    return drawn


def real_tree() -> list[tuple[str, str | None]]:
    """(class, parent) of CtxError and every subclass of it."""
    out: list[tuple[str, str | None]] = [(CtxError.__name__, None)]
    todo: list[type[CtxError]] = [CtxError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            out.append((sub.__name__, cls.__name__))
            todo.append(sub)
    return out


def test_error_tree_drawing_shows_every_error_class_once_under_its_parent() -> None:
    assert errors_module.__doc__ is not None
    drawn = drawn_tree(errors_module.__doc__)
    names = [name for name, _ in drawn]
    assert sorted(name for name in names if names.count(name) > 1) == [], "a class drawn twice"
    assert sorted(drawn, key=str) == sorted(real_tree(), key=str)


def test_error_tree_drawing_is_read_by_depth_and_ignores_wrapped_comments() -> None:
    doc = (
        "Errors.\n\n::\n\n"
        "    Root          a comment\n"
        "    ├── A(x)\n"
        "    │   ├── B     wrapped\n"
        "    │   │         Comment\n"
        "    │   └── C\n"
        "    └── D\n\nAfter.\n"
    )
    assert drawn_tree(doc) == [("Root", None), ("A", "Root"), ("B", "A"), ("C", "A"), ("D", "Root")]
