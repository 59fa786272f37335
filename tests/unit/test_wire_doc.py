"""docs/wire.md names every subject the code defines and every grant a client identity has."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import contracts
from contracts.identities import OPERATOR, runtime_user
from contracts.subjects import PARTITIONED
from infra.asyncapi import CHANNELS
from infra.nats_accounts import grants

WIRE = (Path(__file__).resolve().parents[2] / "docs" / "wire.md").read_text()
_TENANT = "tenant"
# Where stream CTX_EVENTS stores an event (its subject transform): no channel, since no client uses it.
_STORED = f"{PARTITIONED}.{{partition}}.{{tenant}}.{{session_id}}.{{run_id}}.{{instance_id}}"


def _table(heading: str) -> dict[str, list[str]]:
    """The first table after ``heading``: its first cell's code span → the row's cells."""
    lines = WIRE.split(f"\n{heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = {}
    for line in lines[start + 2 : end]:
        cells = line.split(" | ")
        rows[cells[0].removeprefix("| ").strip("`")] = cells
    return rows


def _subject(documented: str) -> str:
    return re.sub(r"<([a-z_]+)>", r"{\1}", documented)


def _contract_subjects() -> set[str]:
    """Every module-level subject constant of ``contracts`` (a ``ctx.`` string in capitals)."""
    found: set[str] = set()
    for info in pkgutil.iter_modules(contracts.__path__):
        module = importlib.import_module(f"contracts.{info.name}")
        found |= {
            value
            for name, value in vars(module).items()
            if name.isupper() and isinstance(value, str) and value.startswith("ctx.")
        }
    return found


def test_wire_doc_subject_table_lists_every_channel_and_nothing_else() -> None:
    documented = {_subject(s) for s in _table("## Subjects")}
    assert documented == {c.address for c in CHANNELS} | {_STORED}


def test_wire_doc_subject_table_covers_every_subject_constant_of_the_contracts() -> None:
    documented = [_subject(s).split(".") for s in _table("## Subjects")]
    missing = [
        constant
        for constant in sorted(_contract_subjects())
        if not any(tokens[: len(constant.split("."))] == constant.split(".") for tokens in documented)
    ]
    assert missing == []


def test_wire_doc_grants_are_what_the_nats_table_gives_each_client_identity() -> None:
    table = _table("### Grants")
    given = grants((_TENANT,))
    for user in (runtime_user(_TENANT), OPERATOR):
        publish, subscribe = table[user.replace(_TENANT, "<tenant>")][1:3]
        spans = [re.findall(r"`([^`]+)`", cell) for cell in (publish, subscribe)]
        documented = [{s.replace("<tenant>", _TENANT) for s in cell} for cell in spans]
        assert documented == [set(given[user].publish), set(given[user].subscribe)], user
