"""The pollution probe and the state probe, and the synthetic state-heavy traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.core.evaluation.inventory import INVENTORY_CATALOG, inventory_trace, item_path
from services.core.evaluation.pollution import StateProbe, current_shown, stale_survives, state_probes_at
from services.core.trace import read_trace
from tests.unit.test_eval_synthetic import TraceBuilder

from infra.cli import main
from infra.ladder_cli import line_json, ladder_traces, write_synthetic

_ITEM = item_path("sku-0042")
_PROBE = StateProbe(_ITEM, "shelf_B", ("shelf_A",))
_STATE = "[state: current facts — each is the latest recorded value; superseded values are history]"


def test_pollution_current_value_named_with_what_it_superseded_passes_beside_an_old_summary() -> None:
    text = "\n".join(
        [
            "[context summary] moved sku-0042 to shelf_A",
            _STATE,
            f'- {_ITEM} = "shelf_B" (CURRENT, source e30); supersedes "shelf_A" from e10',
        ]
    )
    assert not stale_survives(_PROBE, text) and current_shown(_PROBE, text)


def test_pollution_old_and_new_value_as_equal_statements_fail() -> None:
    text = '{"item_id": "sku-0042", "location": "shelf_A"}\n{"item_id": "sku-0042", "location": "shelf_B"}'
    assert stale_survives(_PROBE, text)


def test_pollution_a_bare_current_value_without_its_supersession_does_not_disown_an_old_one() -> None:
    text = f'moved to shelf_A\n{_STATE}\n- {_ITEM} = "shelf_B" (CURRENT, source e30)'
    assert stale_survives(_PROBE, text)


def test_pollution_a_superseded_value_marked_current_fails_whatever_else_is_shown() -> None:
    text = f'{_STATE}\n- {_ITEM} = "shelf_A" (CURRENT, source e10); supersedes "shelf_0" from e1'
    assert stale_survives(_PROBE, text) and not current_shown(_PROBE, text)


def test_pollution_a_context_showing_only_the_current_value_passes() -> None:
    assert not stale_survives(_PROBE, '{"location": "shelf_B"}')


def test_state_probes_follow_the_declared_effects_of_successful_outcomes_only() -> None:
    t = TraceBuilder().system("s").user("Move it.")
    t.call("m", ("m1", "move_item", {"item_id": "sku-0042", "to": "shelf_A"}))
    t.result("m1", '{"location": "shelf_A"}')
    t.call("m", ("m2", "move_item", {"item_id": "sku-0042", "to": "shelf_C"}))
    t.result("m2", "the forklift broke", status="error")  # a failed move moves nothing
    t.call("m", ("m3", "move_item", {"item_id": "sku-0042", "to": "shelf_B"}))
    t.result("m3", '{"location": "shelf_B"}')

    assert state_probes_at(t.lines, INVENTORY_CATALOG) == [_PROBE]
    assert state_probes_at(t.lines, None) == []


def test_inventory_trace_names_every_bin_once_and_supersedes_every_item_many_times() -> None:
    lines = inventory_trace(120, 6)
    bins = [str(c.args["to"]) for line in lines for c in line.tool_calls if c.name == "move_item"]
    assert len(bins) == 120 == len(set(bins))
    probes = state_probes_at(lines, INVENTORY_CATALOG)
    assert len(probes) == 6 and all(len(p.superseded) == 19 for p in probes)
    assert inventory_trace(120, 6) == lines


def test_write_synthetic_writes_the_same_traces_every_time_and_the_ladder_reads_them_with_their_catalog(
    tmp_path: Path,
) -> None:
    first = {p.name: p.read_bytes() for p in write_synthetic(tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in write_synthetic(tmp_path / "b")}
    assert first == second
    inventory, coding = sorted((tmp_path / "a").glob("*.jsonl"), key=lambda p: not p.name.startswith("inv"))
    assert len(read_trace(coding)) == 2 + 2 * 1000 + 1
    (trace,) = ladder_traces([inventory], None)
    assert trace.catalog == INVENTORY_CATALOG and list(trace.lines) == read_trace(inventory)


def test_bundled_synthetic_traces_are_the_ones_the_generator_writes(tmp_path: Path) -> None:
    bundled = Path(__file__).resolve().parents[2] / "infra" / "samples" / "synthetic"
    fresh = {p.name: p.read_bytes() for p in write_synthetic(tmp_path)}
    assert {p.name: p.read_bytes() for p in bundled.iterdir()} == fresh


def test_eval_ladder_command_prints_the_ladder_and_writes_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "moves.jsonl"
    trace.write_text(
        "".join(json.dumps(line_json(line)) + "\n" for line in inventory_trace(12, 3)), encoding="utf-8"
    )
    (tmp_path / "moves.catalog.json").write_text(INVENTORY_CATALOG.model_dump_json(), encoding="utf-8")
    out = tmp_path / "ladder.json"

    # 1,000 tokens: the whole history stops fitting halfway through the twelve moves.
    assert main(["eval", "--ladder", str(trace), "--budget", "1000", "--json", str(out)]) == 0

    report = json.loads(out.read_text())
    assert report["rungs"] == [
        "A-full",
        "B-window",
        "C-summary",
        "D-state",
        "F-projection",
        "G-retrieval",
        "rollover",
    ]
    f = report["aggregate"]["1000"]["F-projection"]
    assert f["stale_state_survival"]["checked"] > 0 and f["stale_state_survival"]["survived"] == 0
    assert "F-projection" in capsys.readouterr().out
