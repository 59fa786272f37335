"""Progress of long CLI work (replays, reindexing): a ``rich`` bar on stderr, only for a person watching.

Off when stderr is not a terminal (a script, CI, a pipe) or with ``--quiet``: stdout keeps only the
results, and logs stay free of redraw sequences.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["Advance", "progress_bar"]

# ``advance(done, total)``: how far the work is, as the services report it.
Advance = Callable[[int, int], None]


def _ignore(done: int, total: int) -> None:
    """No bar: the work reports, nobody draws."""


@contextmanager
def progress_bar(description: str, *, quiet: bool = False, stream: TextIO | None = None) -> Iterator[Advance]:
    """A callback that moves a progress bar on ``stream`` (stderr), removed once the work is done."""
    out = stream if stream is not None else sys.stderr
    if quiet or not out.isatty():
        yield _ignore
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=out),
        transient=True,
    )
    task = progress.add_task(description, total=None)

    def advance(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    with progress:
        yield advance
