"""``ctxfleet served`` against a running fleet (the real ``main``, real servers): the history, one step
as the model saw it, and its diff."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import asyncpg
import pytest

from contracts import PrepareRequest
from infra.cli import main
from ctxfleet_client import FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


@pytest.fixture
def cli_env(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_DATABASE_URL", database_url)
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path / "cli-data"))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


async def _prepare(client: FleetClient, t: Thread, after: str) -> None:
    await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            model_profile="gpt-4o",
            after_event_key=after,
        )
    )


async def test_served_command_lists_steps_and_shows_a_step_as_the_model_saw_it_with_its_diff(
    fleet: Fleet,
    client: FleetClient,
    db: asyncpg.Connection,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    t = Thread()
    await client.append(t.system("You fix bugs in a Python repository."))
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    await _prepare(client, t, "task")
    await client.append(t.assistant("Reading it.", calls=(("c1", "bash", {"cmd": "cat app.py"}),)))
    await client.append(t.outcome("c1", "import missing_module", key="out1"))
    await _prepare(client, t, "out1")

    async def both_served() -> bool:
        count = await db.fetchval(
            "SELECT count(*) FROM ctx.served_contexts WHERE thread_id = $1", t.thread_id
        )
        return int(count) == 2

    await eventually(both_served, what="two served contexts recorded")

    code, out, err = await asyncio.to_thread(_run, ["served", t.thread_id], capsys)
    assert (code, err) == (0, "")
    assert f"thread {t.thread_id} (tenant default): 2 served contexts kept" in out
    assert "first" in out and "new records" in out

    code, out, err = await asyncio.to_thread(_run, ["served", t.thread_id, "--step", "2", "--diff"], capsys)
    assert (code, err) == (0, "")
    assert "changes since step 1: +1 −0 ~0" in out
    assert "[new records]" in out and "import missing_module" not in out

    code, out, err = await asyncio.to_thread(_run, ["served", t.thread_id, "--step", "2"], capsys)
    assert (code, err) == (0, "")
    assert "as the model saw it" in out and "import missing_module" in out and "cat app.py" in out

    code, out, err = await asyncio.to_thread(_run, ["served", t.thread_id, "--step", "2", "--json"], capsys)
    shown = json.loads(out)
    assert [c["reason"] for c in shown["changes"]] == ["new_records"]
    assert any("import missing_module" in (text or "") for text in shown["texts"].values())

    code, out, err = await asyncio.to_thread(_run, ["served", t.thread_id, "--step", "9"], capsys)
    assert code != 0 and "step 9" in err

    svg = tmp_path / "steps.svg"
    code, out, err = await asyncio.to_thread(_run, ["served", t.thread_id, "--plot", str(svg)], capsys)
    assert (code, err) == (0, "")
    assert svg.read_text().startswith("<svg") and svg.read_text().count('class="seg ') >= 2
    code, out, err = await asyncio.to_thread(
        _run, ["served", t.thread_id, "--plot", str(tmp_path / "x.pdf")], capsys
    )
    assert code != 0 and "--plot writes .svg or .png" in err
    if shutil.which("chromium") is not None:
        png = tmp_path / "steps.png"
        code, out, err = await asyncio.to_thread(_run, ["served", t.thread_id, "--plot", str(png)], capsys)
        assert (code, err) == (0, "")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
