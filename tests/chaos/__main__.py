"""``python -m tests.chaos``: run the chaos scenarios, print the table, exit 1 if any invariant failed."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .harness import Stack
from .scenarios import SCALES, Scenario, ScenarioReport, run_scenario

# (header, report attribute); lost … drain are the invariants and must all read 0.
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("scenario", "scenario"),
    ("events", "events"),
    ("publishes", "publishes"),
    ("faults", "faults"),
    ("lost", "lost"),
    ("dup", "duplicated"),
    ("reord", "reordered"),
    ("stuck", "stuck"),
    ("chain", "chain_failures"),
    ("replay", "replay_failures"),
    ("dlq err", "dead_letter_errors"),
    ("unserved", "unserved"),
    ("drain", "unbounded_shutdowns"),
    ("prepares", "prepares"),
    ("prep err", "failed_prepares"),
    ("ready s", "ready_s"),
    ("recover s", "recover_s"),
    ("took s", "elapsed_s"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen scenarios at the chosen scale; 0 when every invariant held."""
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    p.add_argument("--scale", choices=sorted(SCALES), default="small")
    p.add_argument(
        "--only",
        action="append",
        choices=[s.value for s in Scenario],
        help="run only this scenario (repeatable)",
    )
    p.add_argument("--json", type=Path, help="write every report here")
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--keep", action="store_true", help="keep the servers' data and worker logs")
    args = p.parse_args(argv)
    scenarios = [Scenario(name) for name in args.only] if args.only else list(Scenario)
    reports = asyncio.run(_run(scenarios, args.scale, args.seed, args.keep))
    Console(width=190).print(render_table(reports, title=f"chaos, {args.scale} scale"))
    for report in reports:
        for note in report.notes:
            print(f"{report.scenario}: {note}")
        if report.prepare_errors:
            print(
                f"{report.scenario}: prepare errors while the load ran: {json.dumps(report.prepare_errors)}"
            )
        if report.dead_letter_codes:
            print(f"{report.scenario}: codes: {json.dumps(report.dead_letter_codes)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.as_json() for r in reports], indent=2) + "\n")
    return 0 if all(r.ok for r in reports) else 1


async def _run(scenarios: Sequence[Scenario], scale: str, seed: int, keep: bool) -> list[ScenarioReport]:
    root = Path(tempfile.mkdtemp(prefix="ctx-chaos-"))
    stack = Stack()
    await asyncio.to_thread(stack.start)
    reports = []
    try:
        for i, scenario in enumerate(scenarios):
            started = time.monotonic()
            report = await run_scenario(
                stack, scenario, SCALES[scale], seed=seed + i, workdir=root / scenario.value
            )
            print(
                f"{scenario.value}: {'ok' if report.ok else 'FAILED'} in {time.monotonic() - started:.1f}s",
                flush=True,
            )
            reports.append(report)
    finally:
        await asyncio.to_thread(stack.stop if keep else stack.close)
        if keep:
            print(f"kept worker logs in {root}, server data in {stack.root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return reports


def render_table(reports: Sequence[ScenarioReport], title: str) -> Table:
    """One row per scenario; a failed invariant's cell is red."""
    table = Table(title=title)
    for header, _ in _COLUMNS:
        table.add_column(header, justify="left" if header == "scenario" else "right")
    for report in reports:
        failed = set(report.failures)
        cells = []
        for _, name in _COLUMNS:
            value = getattr(report, name)
            text = "—" if value is None else str(value)
            cells.append(f"[red]{text}[/red]" if name in failed else text)
        table.add_row(*cells)
    return table


if __name__ == "__main__":
    sys.exit(main())
