"""``ctxfleet context`` and ``ctxfleet compact`` against a running fleet (the real ``main``, real servers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from contracts import CompactRequest, PrepareRequest
from contracts.hook_protocol import HookAnnotation, HookPatch, HookReply
from contracts.hooks import HookPoint
from infra.cli import main
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import HookService
from tests.integration.test_hooks_fleet import _hook, _release, _working_thread, end_early

pytestmark = [pytest.mark.pg, pytest.mark.nats]


async def _thread(client: FleetClient, groups: int) -> Thread:
    t = Thread()
    await client.append(t.system("You fix bugs in a Python repository."))
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    for i in range(groups):
        await client.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat f{i}.py"}),)))
        await client.append(t.outcome(f"c{i}", f"contents of f{i}.py " * 80, key=f"out{i}"))
    await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            model_profile="gpt-4o",
            after_event_key=f"out{groups - 1}",
        )
    )
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
