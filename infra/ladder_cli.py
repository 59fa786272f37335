"""``ctxfleet eval --ladder`` and ``--write-synthetic``: the ablation ladder's traces, run and table."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contracts import ToolCatalog

from services.core.evaluation import with_system_prompt
from services.core.evaluation.inventory import INVENTORY_CATALOG, inventory_trace
from services.core.evaluation.synthetic import synthetic_trace
from services.core.trace import TraceLine, read_trace
from .laddering import LadderReport, LadderTrace, run_ladder

from . import SAMPLES_DIR

__all__ = [
    "CATALOG_SUFFIX",
    "SYNTHETIC_DIR",
    "ladder_traces",
    "line_json",
    "print_ladder",
    "print_tables",
    "run_ladder_command",
    "write_synthetic",
]

SYNTHETIC_DIR = SAMPLES_DIR / "synthetic"
# A trace's release catalog lives beside it (the trace format has no place for one).
CATALOG_SUFFIX = ".catalog.json"
_INVENTORY = "inventory-moves-600.jsonl"
_CODING = "coding-1000-steps.jsonl"


def write_synthetic(folder: Path) -> list[Path]:
    """Write the synthetic traces (and the inventory's catalog) into ``folder``; the same bytes every time."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, lines in ((_INVENTORY, inventory_trace(600)), (_CODING, synthetic_trace(1000))):
        path = folder / name
        path.write_text("".join(json.dumps(line_json(line)) + "\n" for line in lines), encoding="utf-8")
        written.append(path)
    catalog = folder / (Path(_INVENTORY).stem + CATALOG_SUFFIX)
    catalog.write_text(INVENTORY_CATALOG.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return [*written, catalog]


def ladder_traces(paths: Sequence[Path], prompt: str | None) -> list[LadderTrace]:
    """The traces to run (default: the bundled samples and the synthetic ones), each with its catalog."""
    chosen = list(paths) or [*sorted(SAMPLES_DIR.glob("*.jsonl")), *sorted(SYNTHETIC_DIR.glob("*.jsonl"))]
    out = []
    for path in chosen:
        lines = read_trace(path)
        sidecar = path.with_name(path.stem + CATALOG_SUFFIX)
        catalog = (
            ToolCatalog.model_validate_json(sidecar.read_text(encoding="utf-8")) if sidecar.exists() else None
        )
        out.append(
            LadderTrace(path.name, tuple(with_system_prompt(lines, prompt) if prompt else lines), catalog)
        )
    return out


def run_ladder_command(traces: Sequence[LadderTrace], budgets: Sequence[int]) -> LadderReport:
    """Run the ladder, reporting each trace × budget on stderr as it finishes."""

    def progress(score: Any) -> None:
        print(f"ctxfleet: ladder on {score.trace} at {score.budget}: {score.steps} prepares", file=sys.stderr)

    return asyncio.run(run_ladder(traces, budgets, on_done=progress))


def print_ladder(report: LadderReport) -> None:
    """The ladder as text tables: per trace and budget, then all traces per budget."""
    from rich.console import Console

    heads = [
        "tok/step",
        "tok/task",
        "failed",
        "scored",
        "task",
        "written",
        "error",
        "constr.",
        "state",
        "stale",
        "windows",
        "prep/win",
        "recovery",
        "evidence",
    ]
    console = Console(width=210)
    print_tables(
        console,
        ("ctxfleet eval --ladder: per trace and budget", "ctxfleet eval --ladder: all traces, per budget"),
        "rung",
        heads,
        [
            [
                [score.trace[:44], str(score.budget), name, *_row(rung.as_json())]
                for name, rung in score.rungs.items()
            ]
            for score in report.traces
        ],
        [
            [[str(budget), name, *_row(rung.as_json())] for name, rung in rungs.items()]
            for budget, rungs in report.aggregate().items()
        ],
    )


def print_tables(
    console: Any,
    titles: tuple[str, str],
    key: str,
    heads: Sequence[str],
    per_trace: Sequence[Sequence[Sequence[str]]],
    per_budget: Sequence[Sequence[Sequence[str]]],
) -> None:
    """An eval's two tables, per trace and budget then per budget; a section per trace × budget."""
    from rich.table import Table

    for title, first, sections in zip(
        titles, (["trace", "budget"], ["budget"]), (per_trace, per_budget), strict=True
    ):
        table = Table(title=title)
        for head in [*first, key, *heads]:
            table.add_column(head, justify="left" if head in ("trace", key) else "right")
        for rows in sections:
            for row in rows:
                table.add_row(*row)
            table.add_section()
        console.print(table)


def _row(s: dict[str, Any]) -> list[str]:
    def rate(tally: dict[str, Any]) -> str:
        r = tally["rate"]
        return "-" if r is None else f"{100 * r:.0f}%"

    stale = s["stale_state_survival"]
    recovery = s["rollover_recovery"]
    return [
        "-" if s["tokens_per_step"] is None else f"{s['tokens_per_step']:,}",
        "-" if s["tokens_per_task"] is None else f"{s['tokens_per_task']:,}",
        f"{s['failed']}/{s['prepares']}",
        str(s["scored_contexts"]),
        *(rate(s["probes"][k]) for k in ("task", "files_written", "last_error", "constraints")),
        rate(s["state_probe"]),
        "-" if stale["rate"] is None else f"{100 * stale['rate']:.0f}% of {stale['checked']}",
        str(s["windows"]),
        "-" if s["prepares_per_window"] is None else f"{s['prepares_per_window']:g}",
        "-" if recovery["rate"] is None else f"{100 * recovery['rate']:.0f}% of {recovery['rollovers']}",
        # Contexts that showed evidence (rung G's retrieved archive) and the blocks in all.
        "-" if not s["evidence"]["contexts"] else f"{s['evidence']['contexts']} ({s['evidence']['blocks']})",
    ]


def line_json(line: TraceLine) -> dict[str, Any]:
    """A trace line as the format writes it (defaults left out)."""
    out: dict[str, Any] = {"kind": line.kind, "text": line.text}
    if line.tool_calls:
        out["tool_calls"] = [{"call_id": c.call_id, "name": c.name, "args": c.args} for c in line.tool_calls]
    if line.call_id is not None:
        out["call_id"] = line.call_id
    if line.status != "success":
        out["status"] = line.status
    if line.run is not None:
        out["run"] = line.run
    if line.usage is not None:
        out["usage"] = line.usage.model_dump(mode="json", exclude_none=True)
    return out
