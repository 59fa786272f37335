"""A thread's served contexts as a chart: SVG drawn on the server, no script.

Tokens per step as bars stacked by category, against the input budget, the compaction trigger and
the water levels as horizontal lines, with compactions and rollovers marked where they took effect.
The y axis starts at zero and is labelled in round steps, so a 109k budget reads as well as a 6k one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["CATEGORIES", "ChartLine", "ChartMark", "ChartStep", "timeline_svg"]

# Drawn bottom-up in this order, with these colours (the legend reads the same).
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("instructions", "#8b5cf6"),
    ("tool_schemas", "#9ca3af"),
    ("summaries", "#f59e0b"),
    ("history", "#60a5fa"),
    ("materials", "#10b981"),
    ("envelopes", "#d1d5db"),
)
_WIDTH, _HEIGHT = 1120, 380
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 150, 46, 44


@dataclass(frozen=True, slots=True)
class ChartStep:
    """One served context: its step and its tokens per category."""

    step: int
    tokens: dict[str, int]


@dataclass(frozen=True, slots=True)
class ChartLine:
    """A horizontal threshold in tokens (the budget, the trigger, a water level)."""

    name: str
    tokens: int
    colour: str
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class ChartMark:
    """A vertical mark before a step: a compaction or a rollover took effect there."""

    step: int
    label: str
    kind: str


def _nice(top: int) -> int:
    """A round tick interval giving about five ticks up to ``top``."""
    raw = max(1, top) / 5
    magnitude = int(10 ** (len(str(int(raw))) - 1))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return int(factor * magnitude)
    return 10 * magnitude


def _label(tokens: int) -> str:
    if tokens >= 1000:
        shown = f"{tokens / 1000:.1f}".removesuffix(".0")
        return f"{shown}k"
    return str(tokens)


def timeline_svg(steps: Sequence[ChartStep], lines: Sequence[ChartLine], marks: Sequence[ChartMark]) -> str:
    """The chart as an ``<svg>`` element (text in it is escaped)."""
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    highest = max([sum(s.tokens.values()) for s in steps] + [line.tokens for line in lines] + [1])
    tick = _nice(highest)
    top = tick * -(-highest // tick)
    slot = plot_w / max(1, len(steps))
    bar = max(1.0, slot * 0.8)

    def y(tokens: float) -> float:
        return _TOP + plot_h - plot_h * tokens / top

    def x(index: int) -> float:
        return _LEFT + slot * index

    out = [
        f'<svg id="timeline-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_WIDTH} {_HEIGHT}" '
        f'width="{_WIDTH}" height="{_HEIGHT}" role="img" aria-label="tokens per served step">',
        "<style>text { font: 11px system-ui, sans-serif; fill: #374151; }</style>",
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#e3e6ea"/>',
    ]
    for value in range(0, top + 1, tick):
        out.append(
            f'<line class="y-tick" x1="{_LEFT}" x2="{_LEFT + plot_w}" '
            f'y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eef0f3"/>'
            f'<text x="{_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{_label(value)}</text>'
        )
    out.append(
        f'<text x="14" y="{_TOP + plot_h / 2:.0f}" transform="rotate(-90 14 {_TOP + plot_h / 2:.0f})" '
        'text-anchor="middle">tokens</text>'
    )
    every = _nice(len(steps)) if len(steps) > 20 else 1
    for i, s in enumerate(steps):
        base = 0
        for name, colour in CATEGORIES:
            tokens = s.tokens.get(name, 0)
            if tokens <= 0:
                continue
            out.append(
                f'<rect class="seg {name}" data-step="{s.step}" data-tokens="{tokens}" '
                f'x="{x(i) + (slot - bar) / 2:.1f}" '
                f'y="{y(base + tokens):.1f}" width="{bar:.1f}" height="{y(base) - y(base + tokens):.1f}" '
                f'fill="{colour}"><title>step {s.step} · {name} {tokens:,} tokens</title></rect>'
            )
            base += tokens
        if s.step % every == 0 or len(steps) <= 20:
            out.append(
                f'<text class="x-tick" x="{x(i) + slot / 2:.1f}" y="{_TOP + plot_h + 14}" '
                f'text-anchor="middle">{s.step}</text>'
            )
    out.append(
        f'<text x="{_LEFT + plot_w / 2:.0f}" y="{_HEIGHT - 8}" text-anchor="middle">served step</text>'
    )
    index = {s.step: i for i, s in enumerate(steps)}
    for m in marks:
        if m.step not in index:
            continue
        at = x(index[m.step])
        colour = "#b45309" if m.kind == "compaction" else "#be123c"
        # Near the right edge the label reads leftwards, clear of the lines' labels.
        side, anchor = (-1, "end") if at > _LEFT + 0.8 * plot_w else (1, "start")
        out.append(
            f'<g class="mark {escape(m.kind)}">'
            f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{_TOP}" y2="{_TOP + plot_h}" '
            f'stroke="{colour}" stroke-width="1.5" stroke-dasharray="4 3"/>'
            f'<text x="{at + side * 3:.1f}" y="{_TOP - 6}" fill="{colour}" text-anchor="{anchor}">'
            f"{escape(m.label)}</text></g>"
        )
    # Labels of lines close together are pushed apart, top down, so each stays readable.
    placed: list[float] = []
    for line in sorted(lines, key=lambda item: -item.tokens):
        at = y(line.tokens)
        label_y = max(at + 4, placed[-1] + 13) if placed else at + 4
        placed.append(label_y)
        dash = ' stroke-dasharray="6 4"' if line.dashed else ""
        out.append(
            f'<g class="line" data-name="{escape(line.name)}" data-tokens="{line.tokens}">'
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{at:.1f}" y2="{at:.1f}" '
            f'stroke="{line.colour}" stroke-width="1.5"{dash}/>'
            f'<text x="{_LEFT + plot_w + 6}" y="{label_y:.1f}" fill="{line.colour}">'
            f"{escape(line.name)} {line.tokens:,}</text></g>"
        )
    for n, (name, colour) in enumerate(CATEGORIES):
        lx = _LEFT + 100 * n
        out.append(
            f'<rect x="{lx}" y="6" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="15">{name}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)
