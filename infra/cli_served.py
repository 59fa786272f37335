"""``ctxfleet served``: the contexts the fleet answered a thread, as text (the console's served pages).

The history lists every step kept with its tokens, stable prefix and what changed; ``--step N`` shows
that step as the model saw it (each block with its text), ``--diff`` only what changed since step
N−1 and why; ``--plot FILE`` writes the console's chart, as SVG or (with Debian's chromium) PNG.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from services.core.served import change_symbol
from workers.console.reading import ServedPage, StepPage

__all__ = ["history_json", "render_history", "render_step", "step_json", "write_plot"]

# The chart's own size (workers/console/chart.py): the PNG is the chart, no page around it.
_PLOT_SIZE = "1120,380"


def render_history(page: ServedPage) -> str:
    """One line per served step: when, what for, tokens of the budget, stable prefix, changes, reasons."""
    lines = [f"thread {page.thread_id} (tenant {page.tenant}): {len(page.rows)} served contexts kept"]
    lines.append(
        f"{'step':>5}  {'served at':<8}  {'purpose':<10} {'format':<18} {'tokens':>13}  {'stable':>7}  "
        "view  changes      reasons"
    )
    for row in page.rows:
        s, counts = row.served.served, row.diff.counts()
        reasons = ", ".join(dict.fromkeys(c.reason.replace("_", " ") for c in row.diff.changes)) or "-"
        changes = f"+{counts['added']} −{counts['removed']} ~{counts['changed']}"
        lines.append(
            f"{row.served.step:>5}  {row.served.served_at:%H:%M:%S}  {s.purpose:<10} {s.format:<18} "
            f"{f'{s.used.total}/{s.input_budget}':>13}  {row.diff.stable_prefix_tokens:>7}  "
            f"v{s.view_revision:<3} {changes:<12} {reasons}"
        )
    for c in page.compactions:
        lines.append(
            f"compaction {c.view_revision}: records #{c.covered_from}–#{c.covered_to}, "
            f"{c.tokens_before} → {c.tokens_after} tokens ({', '.join(c.trigger_reasons)})"
        )
    return "\n".join(lines)


def render_step(page: StepPage, *, diff_only: bool) -> str:
    """The step's figures, its diff against the step before, and (unless ``diff_only``) every block's text."""
    s = page.step.served
    since = f"step {page.previous.step}" if page.previous else "the start"
    counts = page.diff.counts()
    lines = [
        f"step {page.step.step} of {page.thread_id}, served {page.step.served_at:%Y-%m-%d %H:%M:%S %Z}: "
        f"{s.purpose}, {s.format}, {s.used.total} of {s.input_budget} tokens, "
        f"stable prefix {page.diff.stable_prefix_tokens} tokens, view {s.view_revision}, window {s.window}, "
        f"policy {s.policy}, after record #{s.thread_seq}",
        f"changes since {since}: +{counts['added']} −{counts['removed']} ~{counts['changed']} "
        f"({page.diff.kept} kept)",
    ]
    for c in page.diff.changes:
        tokens = f"{c.before.tokens} → {c.block.tokens}" if c.before else str(c.block.tokens)
        lines.append(
            f"  {change_symbol(c.change)} {c.block.block_id:<16} {c.block.kind:<12} {tokens:>12} tokens  "
            f"[{c.reason.replace('_', ' ')}] {c.detail}"
        )
    if diff_only:
        return "\n".join(lines)
    lines.append("")
    lines.append(f"as the model saw it ({len(s.blocks)} blocks):")
    for b in s.blocks:
        lines.append(f"--- {b.block_id} ({b.kind}, {b.tokens} tokens, {b.retention}): {b.reason}")
        lines.append(page.texts.get(b.digest, "(text not kept)"))
    return "\n".join(lines)


def history_json(page: ServedPage) -> str:
    """The history for scripts: per step its manifest and what changed."""
    return json.dumps(
        {
            "thread_id": page.thread_id,
            "tenant": page.tenant,
            "steps": [
                {
                    "step": row.served.step,
                    "served_at": row.served.served_at.isoformat(),
                    "stable_prefix_tokens": row.diff.stable_prefix_tokens,
                    "changes": dict(row.diff.counts()),
                    "served": row.served.served.model_dump(mode="json"),
                }
                for row in page.rows
            ],
        },
        indent=2,
    )


def step_json(page: StepPage) -> str:
    """One step for scripts: its manifest, its changes with their reasons, and its blocks' texts."""
    return json.dumps(
        {
            "step": page.step.step,
            "served_at": page.step.served_at.isoformat(),
            "served": page.step.served.model_dump(mode="json"),
            "stable_prefix_tokens": page.diff.stable_prefix_tokens,
            "changes": [
                {
                    "change": c.change,
                    "block_id": c.block.block_id,
                    "reason": c.reason,
                    "detail": c.detail,
                    "tokens": c.block.tokens,
                    "tokens_before": None if c.before is None else c.before.tokens,
                }
                for c in page.diff.changes
            ],
            "texts": {b.block_id: page.texts.get(b.digest) for b in page.step.served.blocks},
        },
        indent=2,
    )


def write_plot(page: ServedPage, path: Path) -> str | None:
    """Write the chart to ``path`` (``.svg``, or ``.png`` drawn by headless chromium); why not, when not."""
    if path.suffix == ".svg":
        path.write_text(page.chart, encoding="utf-8")
        return None
    if path.suffix != ".png":
        return f"--plot writes .svg or .png, not {path.suffix or 'a file without a suffix'}"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return "a PNG is drawn by Debian's chromium (make chromium); an .svg needs nothing"
    with tempfile.TemporaryDirectory() as folder:
        html = Path(folder) / "chart.html"
        html.write_text(f"<!doctype html><body style='margin:0'>{page.chart}</body>", encoding="utf-8")
        done = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--window-size={_PLOT_SIZE}",
                f"--screenshot={path.resolve()}",
                html.as_uri(),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    if done.returncode != 0 or not path.exists():
        return f"chromium could not draw the chart: {done.stderr.strip()[-300:]}"
    return None
