"""``ctxfleet context`` and ``ctxfleet compact`` against a running fleet (the real ``main``, real servers)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import urllib.request

import asyncpg
import pytest

from contracts import (
    CompactRequest,
    ContextPolicy,
    EvidenceRef,
    PatchOp,
    PathRule,
    PrepareRequest,
    StatePatchEvent,
    StatePatchPayload,
    ToolCatalog,
    ToolEffect,
    ToolSpec,
)
from contracts.windows import WindowPolicy, WindowStrategy
from contracts.hook_protocol import HookAddition, HookAnnotation, HookPatch, HookReply
from contracts.hooks import AdditionCategory, HookPoint
from services.core.assemble import added_tokens
from services.core.hook_patches import HOOK_BLOCK_PREFIX
from infra.cli import main
from ctxfleet_client.client import FleetClient
from infra.embedded import free_port
from tests.fixtures.builders import Thread, prepare_request
from tests.fixtures.fleet import HookService, eventually
from workers.app import Fleet
from tests.integration.test_hooks_fleet import _hook, _release, _working_thread, end_early

pytestmark = [pytest.mark.pg, pytest.mark.nats]


async def _thread(client: FleetClient, groups: int) -> Thread:
    t = Thread()
    await client.append(t.system("You fix bugs in a Python repository."))
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    for i in range(groups):
        await client.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat f{i}.py"}),)))
        await client.append(t.outcome(f"c{i}", f"contents of f{i}.py " * 80, key=f"out{i}"))
    await client.prepare(prepare_request(t, after_event_key=f"out{groups - 1}"))
    return t


@pytest.fixture
def cli_env(streams: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_NATS_URL", streams)
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "cli-data"))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    # main() runs its own event loop: off the test's loop, as a person's shell would run it.
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


async def _in_thread(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return await asyncio.to_thread(_run, argv, capsys)


@pytest.mark.anyio
async def test_context_command_json_itemizes_every_block_with_its_reason_and_share_of_the_budget(
    fleet, client: FleetClient, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    t = await _thread(client, 3)

    code, out, err = await _in_thread(["context", t.thread_id, "--budget", "4000", "--json"], capsys)

    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert shown["thread_id"] == t.thread_id and shown["session_id"] == t.session_id
    assert shown["input_budget"] == 4000
    assert sum(c["tokens"] for c in shown["categories"]) == shown["used"]
    assert shown["blocks"] and all(b["reason"] for b in shown["blocks"])
    assert sum(b["tokens"] for b in shown["blocks"]) <= shown["used"]
    first = shown["blocks"][0]
    assert first["share"] == round(100 * first["tokens"] / 4000, 1)
    assert shown["summary"] is None


@pytest.mark.anyio
async def test_context_command_draws_the_budget_bar_blocks_and_summary_coverage_after_compact(
    fleet, client: FleetClient, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    t = await _thread(client, 6)

    code, out, err = await _in_thread(["compact", t.thread_id], capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"compacted {t.thread_id}: ") and "summary " in out

    code, out, err = await _in_thread(["context", t.thread_id], capsys)

    assert (code, err) == (0, "")
    assert f"Context {t.thread_id}" in out
    assert "█" in out and "tokens used" in out
    assert "why it is there" in out
    assert "summary " in out and "covers records #" in out


async def _settled(db: asyncpg.Connection, thread_id: str) -> bool:
    """The budgeter evaluated the thread's head and asked for nothing: the view moves only if asked to."""
    row = await db.fetchrow(
        "SELECT v.evaluated_revision, v.pending_fingerprint, h.revision FROM ctx.thread_views v "
        "JOIN ctx.thread_heads h USING (thread_id) WHERE thread_id = $1",
        thread_id,
    )
    return (
        row is not None
        and row["evaluated_revision"] == row["revision"]
        and row["pending_fingerprint"] is None
    )


async def _ledger_and_view(db: asyncpg.Connection, thread_id: str) -> tuple[object, ...]:
    """Everything a prepare could write for a thread: head, view (and a pending job), summaries, windows."""
    head = await db.fetchrow("SELECT * FROM ctx.thread_heads WHERE thread_id = $1", thread_id)
    view = await db.fetchrow("SELECT * FROM ctx.thread_views WHERE thread_id = $1", thread_id)
    summaries = await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id = $1", thread_id)
    windows = await db.fetchval("SELECT count(*) FROM ctx.windows WHERE thread_id = $1", thread_id)
    return dict(head or {}), dict(view or {}), summaries, windows


@pytest.mark.anyio
async def test_context_command_at_a_tight_budget_writes_nothing_and_says_the_compaction_the_runtime_would_ask(
    fleet, client: FleetClient, db: asyncpg.Connection, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    t = await _thread(client, 6)
    await eventually(lambda: _settled(db, t.thread_id), what="the budgeter to evaluate the thread")
    before = await _ledger_and_view(db, t.thread_id)
    # Tight: the runtime's prepare at this budget waits for a hard_budget compaction (proved below).
    tight = "1500"

    code, out, err = await _in_thread(["context", t.thread_id, "--budget", tight, "--json"], capsys)

    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert shown["input_budget"] == 1500 and shown["used"] <= 1500
    assert shown["budget_source"].startswith("the session's policy default@")
    assert shown["budget_source"].endswith("capped at 1500 tokens as asked")
    assert any("hard_budget compaction" in w for w in shown["runtime_would"])
    assert any(o["reason"].startswith("history awaiting compaction") for o in shown["omitted"])
    assert await _ledger_and_view(db, t.thread_id) == before
    code, out, _ = await _in_thread(["context", t.thread_id, "--budget", tight], capsys)
    assert code == 0 and "the runtime's prepare would ask for a hard_budget compaction" in out
    assert await _ledger_and_view(db, t.thread_id) == before
    # The runtime's own prepare at that budget does compact: the figures above could have moved.
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=1500
    )
    assert (await client.prepare(request)).view_revision > before[1]["view_revision"]  # type: ignore[index]


@pytest.mark.anyio
async def test_context_command_text_shows_each_blocks_messages_and_the_summary_with_its_sources(
    fleet, client: FleetClient, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    t = await _thread(client, 6)
    assert (await _in_thread(["compact", t.thread_id], capsys))[0] == 0

    code, out, err = await _in_thread(["context", t.thread_id, "--text", "--json"], capsys)

    assert (code, err) == (0, "")
    shown = json.loads(out)
    texts = {x["block_id"]: x for x in shown["texts"]}
    assert list(texts) == [b["block_id"] for b in shown["blocks"]]
    assert "You fix bugs in a Python repository." in texts["instruction:1"]["text"]
    summary = next(x for x in shown["texts"] if x["kind"] == "summary")
    assert summary["text"].startswith("[user]\n[context summary r1: records ")
    assert "(seq " in summary["text"] and summary["sources"]
    assert len(summary["sources"]) == shown["summary"]["cited"]
    code, out, _ = await _in_thread(["context", t.thread_id, "--text"], capsys)
    assert code == 0 and "You fix bugs in a Python repository." in out and "[context summary r1" in out


@pytest.mark.anyio
async def test_compact_command_twice_says_nothing_to_compact_on_one_line(
    fleet, client: FleetClient, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    t = await _thread(client, 6)
    assert (await _in_thread(["compact", t.thread_id, "--json"], capsys))[0] == 0

    code, out, err = await _in_thread(["compact", t.thread_id], capsys)

    assert (code, out) == (2, "")
    assert err.startswith("ctxfleet: nothing_to_compact: ") and err.count("\n") == 1


@pytest.mark.anyio
async def test_context_command_of_an_unknown_thread_is_one_line_thread_not_found(
    fleet, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await _in_thread(["context", "nope.main"], capsys)

    assert (code, out) == (2, "")
    assert err == "ctxfleet: thread_not_found: thread nope.main has no recorded events\n"


@pytest.mark.anyio
async def test_context_command_with_no_worker_serving_says_so_on_one_line(
    cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # NATS is up, no fleet subscribes: the request has no responders.
    code, out, err = await _in_thread(["context", "r1.main"], capsys)

    assert (code, out) == (2, "")
    assert err.startswith("ctxfleet: fleet_unavailable: ") and err.count("\n") == 1


@pytest.mark.anyio
async def test_replay_command_names_its_threads_report_and_dumps_and_context_reads_a_dump(
    fleet, cli_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = Path("infra/samples/swe-agent__gpt4_pydicom__pydicom-1458.jsonl")
    report, dumps = tmp_path / "report.json", tmp_path / "contexts"

    code, out, err = await _in_thread(
        ["replay", str(sample), "--report", str(report), "--dump-contexts", str(dumps)], capsys
    )

    assert (code, err) == (0, "")  # stderr is not a terminal here: no progress bar either
    session = json.loads(report.read_text())["totals"]["session_id"]
    assert f"threads: {session}-r1.main\n" in out
    assert f"report: {report}\n" in out and f"contexts: {dumps}\n" in out
    first = sorted(dumps.iterdir())[0]
    code, out, err = await _in_thread(["context", "--file", str(first), "--json"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out)["thread_id"] == f"{session}-r1.main"


@pytest.mark.anyio
async def test_inspect_command_names_the_tools_and_outcome_statuses_per_record(
    fleet, client: FleetClient, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    t = Thread()
    await client.append(t.user("Fix app.py", key="u1"))
    await client.append(t.assistant(calls=(("c1", "bash", {"cmd": "pytest"}),), key="a1"))
    await client.append(t.outcome("c1", "1 failed", status="error", key="o1"))
    await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            budget_tokens=4000,
            after_event_key="o1",
        )
    )

    code, out, err = await _in_thread(["inspect", t.thread_id], capsys)

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert any(" a1 [bash]  calls: bash" in line for line in lines), out
    assert any(" o1 [bash: error]  1 failed" in line for line in lines), out


@pytest.mark.anyio
async def test_context_command_shows_the_hooks_that_ran_and_the_hook_that_narrowed_the_summary(
    fleet, client: FleetClient, cli_env: None, capsys: pytest.CaptureFixture[str], hook_service: HookService
) -> None:
    note = HookPatch(annotations=(HookAnnotation(text="checked against policy v7"),))
    audit = await _hook(
        hook_service, "audit", HookPoint.PREPARE_AFTER, HookReply(decision="patch", patch=note)
    )
    scope = await _hook(hook_service, "scope", HookPoint.COMPACT_BEFORE, end_early)
    t = await _working_thread(client, await _release(client, audit, scope))
    await client.compact(CompactRequest(run_id=t.run_id, instance_id=t.instance_id))

    code, out, err = await _in_thread(["context", t.thread_id, "--json"], capsys)
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert shown["hooks"] == [
        {
            "source": "audit@1",
            "point": "context.prepare.after",
            "outcome": "annotated",
            "note": "checked against policy v7",
        }
    ]
    assert [(h["source"], h["point"], h["subject"]) for h in shown["summary"]["hooks"]] == [
        ("scope@1", "context.compact.before", scope.subject)
    ]
    code, out, _ = await _in_thread(["context", t.thread_id], capsys)
    assert code == 0 and "checked against policy v7" in out and "shaped by hook scope@1" in out
    code, out, _ = await _in_thread(["inspect", t.thread_id], capsys)
    assert code == 0 and "summary shaped by hook scope@1 at context.compact.before" in out


@pytest.mark.anyio
async def test_the_console_shows_the_blocks_a_prepare_hook_added_as_the_context_command_does(
    start_fleet: Callable[..., Awaitable[Fleet]],
    client: FleetClient,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
    hook_service: HookService,
) -> None:
    fleet = await start_fleet(http_port=free_port())
    runbook = HookAddition(
        category=AdditionCategory.MATERIAL, title="runbook", text="restart the worker first"
    )
    adds = await _hook(
        hook_service,
        "runbook",
        HookPoint.PREPARE_BEFORE,
        HookReply(decision="patch", patch=HookPatch(add=(runbook,))),
        grants=(AdditionCategory.MATERIAL,),
    )
    t = await _working_thread(client, await _release(client, adds))

    code, out, err = await _in_thread(["context", t.thread_id, "--json"], capsys)
    url = f"http://127.0.0.1:{fleet.http_port}/console/threads/{t.thread_id}/context"
    page = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())

    assert (code, err) == (0, "")
    shown = json.loads(out)
    blocks = [b["block_id"] for b in shown["blocks"]]
    assert any(b.startswith(HOOK_BLOCK_PREFIX) for b in blocks), blocks
    assert re.findall(r"text of (\S+) \(", page) == blocks
    assert f'<strong id="used-tokens" data-tokens="{shown["used"]}">' in page
    assert "restart the worker first" in page


@pytest.mark.anyio
async def test_every_surface_counts_hook_material_and_evidence_beside_the_whole_history(
    start_fleet: Callable[..., Awaitable[Fleet]],
    client: FleetClient,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
    hook_service: HookService,
) -> None:
    fleet = await start_fleet(http_port=free_port())
    runbook = HookAddition(
        category=AdditionCategory.MATERIAL, title="runbook", text="restart the worker first " * 20
    )
    adds = await _hook(
        hook_service,
        "runbook",
        HookPoint.PREPARE_BEFORE,
        HookReply(decision="patch", patch=HookPatch(add=(runbook,))),
        grants=(AdditionCategory.MATERIAL,),
    )
    t = await _working_thread(client, await _release(client, adds))
    for n in range(3):  # the same failing test, run again and again: its output repeats
        await client.append(t.assistant(f"try {n}", calls=((f"p{n}", "bash", {"cmd": "pytest -x"}),)))
        await client.append(t.outcome(f"p{n}", "E   ImportError: cannot import name 'x'\n" * 20, key=f"p{n}"))
    await client.prepare(prepare_request(t, after_event_key="p2"))

    code, out, err = await _in_thread(["context", t.thread_id, "--json"], capsys)
    assert (code, err) == (0, "")
    shown = json.loads(out)
    url = f"http://127.0.0.1:{fleet.http_port}/console/threads/{t.thread_id}/context"
    page = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    quoting = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        model_profile="gpt-4o",
        evidence=(EvidenceRef(thread_id=t.thread_id, seq=4),),
    )
    prepared = await client.prepare(quoting)
    code, out, err = await _in_thread(["compact", t.thread_id, "--json"], capsys)
    assert code == 0, err
    compacted = json.loads(out)

    hook_tokens = sum(b["tokens"] for b in shown["blocks"] if b["block_id"].startswith(HOOK_BLOCK_PREFIX))
    assert shown["added"] == hook_tokens > 0
    # The only reduction is the one every context makes: the repeated outputs shown as references.
    assert shown["reductions"] and all(r.startswith("deduplicated:") for r in shown["reductions"])
    assert shown["history"] == compacted["tokens_before"] == shown["used"] - shown["added"]
    assert f'data-history-tokens="{shown["history"]}" data-added-tokens="{shown["added"]}"' in page
    assert f'<strong id="used-tokens" data-tokens="{shown["used"]}">' in page
    # The runtime's prepare quoting a record: the hook's block and the evidence beside the same history.
    assert any(b.block_id.startswith("evidence:") for b in prepared.blocks)
    assert added_tokens(prepared) > shown["added"]
    assert prepared.reductions and all(r.startswith("deduplicated:") for r in prepared.reductions)
    assert prepared.budget_report.used.total == compacted["tokens_before"] + added_tokens(prepared)


# A catalog whose paths the state patches and the moves' effects write: the state facts a context shows.
YARD = ToolCatalog(
    release="yard@1",
    paths=(
        PathRule(pattern="item:{id}.location", kind="business_fact"),
        PathRule(pattern="task.goal", kind="goal"),
    ),
    tools=(
        ToolSpec(
            name="move_item",
            reads=("item:{id}.location",),
            effects=(ToolEffect(path="item:{args.item_id}.location", value="{result.location}"),),
        ),
        ToolSpec(name="count_stock"),
    ),
)


async def _yard_thread(client: FleetClient, policy: str | None) -> Thread:
    await client.register_catalog(YARD)
    t = Thread()
    await client.append(
        t.system("You run the yard.").model_copy(update={"agent_release": "yard@1", "policy": policy})
    )
    await client.append(t.user("Where does item 7 end up?", key="task"))
    goal = PatchOp(op="set", path="task.goal", value="find where item 7 ends up")
    await client.append(
        StatePatchEvent(
            payload=StatePatchPayload(source="orchestrator", ops=(goal,)),
            event_key="goal",
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
        )
    )
    await _yard_groups(client, t, 0, "dock_A")
    return t


async def _yard_groups(client: FleetClient, t: Thread, first: int, location: str) -> str:
    """A move and six counting groups of ~150 tokens each; the key of the last event."""
    await client.append(
        t.assistant(f"moving item 7 to {location}", calls=((f"m{first}", "move_item", {"item_id": 7}),))
    )
    await client.append(t.outcome(f"m{first}", f'{{"location": "{location}"}}'))
    for n in range(first, first + 6):
        await client.append(
            t.assistant(
                "counting the yard " + "row by row, slowly " * 12, calls=((f"c{n}", "count_stock", {}),)
            )
        )
        await client.append(t.outcome(f"c{n}", f"row {n} clear " * 30, key=f"count{n}"))
    return f"count{first + 5}"


async def _with_state(client: FleetClient) -> Thread:
    """A thread whose context shows state facts: a patch's and a tool effect's."""
    t = await _yard_thread(client, None)
    await client.prepare(prepare_request(t, after_event_key="count5"))
    return t


async def _past_a_rollover(client: FleetClient) -> Thread:
    """A thread served from its second window: a handoff and state facts, then history of its own."""
    await client.register_policy(
        ContextPolicy(
            name="roll",
            model_profile=None,
            budget_tokens=1_500,
            window=WindowPolicy(strategy=WindowStrategy.ROLLOVER),
        )
    )
    t = await _yard_thread(client, "roll")
    last = await _yard_groups(client, t, 6, "dock_B")
    ask = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=1_500,
        after_event_key=last,
    )
    assert (await client.prepare(ask)).window == 2
    last = await _yard_groups(client, t, 12, "dock_C")

    async def recorded() -> bool:  # a prepare would roll the window over again: ask the head instead
        return (await client.inspect(t.thread_id, limit=1)).last_event_key == last

    await eventually(recorded, what="the window's own history to be recorded")
    return t


async def _plain(client: FleetClient) -> Thread:
    return await _thread(client, 8)


async def _repeating(client: FleetClient) -> Thread:
    """A thread that reads a file, then runs the same failing test, again and again: every context shows
    the test's output once, the later runs as references to the first one it still shows."""
    t = Thread()
    await client.append(t.system("You fix bugs in a Python repository."))
    await client.append(t.user("Make the test suite pass", key="task"))
    for i in range(4):
        await client.append(t.assistant(f"read {i}", calls=((f"f{i}", "cat", {"p": f"f{i}.py"}),)))
        await client.append(t.outcome(f"f{i}", f"contents of f{i}.py " * 80))
        await client.append(t.assistant(f"try {i}", calls=((f"c{i}", "bash", {"cmd": "pytest -x"}),)))
        await client.append(t.outcome(f"c{i}", "E   ModuleNotFoundError: No module named 'app'\n" * 6))
    await client.append(t.assistant("reading app", calls=(("r", "cat", {"p": "app.py"}),)))
    await client.append(t.outcome("r", "import utils", key="last"))
    await client.prepare(prepare_request(t, after_event_key="last"))
    return t


@pytest.mark.anyio
@pytest.mark.parametrize(
    "make_thread",
    [_plain, _with_state, _past_a_rollover, _repeating],
    ids=["plain", "state", "rollover", "repeated_output"],
)
async def test_compact_context_the_console_and_the_budget_report_count_one_moment_alike(
    start_fleet: Callable[..., Awaitable[Fleet]],
    client: FleetClient,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
    make_thread: Callable[[FleetClient], Awaitable[Thread]],
) -> None:
    fleet = await start_fleet(http_port=free_port())
    t = await make_thread(client)

    code, out, _ = await _in_thread(["context", t.thread_id, "--json"], capsys)
    assert code == 0
    before = json.loads(out)
    code, out, err = await _in_thread(["compact", t.thread_id, "--json"], capsys)
    assert code == 0, err
    compacted = json.loads(out)
    code, out, _ = await _in_thread(["context", t.thread_id, "--json"], capsys)
    assert code == 0
    after = json.loads(out)
    url = f"http://127.0.0.1:{fleet.http_port}/console/threads/{t.thread_id}/context"
    page = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())

    assert (compacted["tokens_before"], compacted["tokens_after"]) == (before["used"], after["used"])
    # Nothing left out, nothing added and no summary yet: the whole history is what the context uses.
    # A summary stands for part of it afterwards, and the whole history stays what it was.
    assert (before["history"], after["history"]) == (before["used"], before["used"])
    assert (before["added"], after["added"]) == (0, 0) and after["used"] < after["history"]
    shown_reply = await client.show_context(t.thread_id)
    shown = shown_reply.prepared.budget_report
    assert shown.used.total == after["used"] and shown.input_budget == after["input_budget"]
    assert shown_reply.history_tokens == after["history"]
    assert f'<strong id="used-tokens" data-tokens="{after["used"]}">' in page
    assert f'data-history-tokens="{after["history"]}" data-added-tokens="0"' in page
    code, out, _ = await _in_thread(["context", t.thread_id], capsys)
    assert code == 0 and f"whole history {after['history']:,} tokens" in out
    assert f"→ {after['used']:,} prepared" in out
    for context in (before, after):
        assert sum(c["tokens"] for c in context["categories"]) == context["used"]
        by_block: dict[str, int] = {}
        for b in context["blocks"]:
            by_block[b["category"]] = by_block.get(b["category"], 0) + b["tokens"]
        assert {c["name"]: c["tokens"] for c in context["categories"] if c["name"] in by_block} == by_block
    summary = after["summary"]
    assert summary["records"] == summary["covered_to"] - summary["covered_from"] + 1
    assert (summary["covered_from"], summary["covered_to"]) == (
        compacted["covered_from"],
        compacted["covered_to"],
    )
    if make_thread in (_with_state, _past_a_rollover):  # the blocks the measure did not count once
        assert any(b["block_id"].startswith("state:") for b in after["blocks"]), after["blocks"]
    if make_thread is _past_a_rollover:
        assert any(b["block_id"].startswith("handoff:") for b in after["blocks"]), after["blocks"]
    if make_thread is _repeating:  # counted once by every surface, as the context shows it
        assert before["reductions"] and all(r.startswith("deduplicated:") for r in before["reductions"])
