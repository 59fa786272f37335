"""One set of event kinds: the wire union's, which ledger records carry too."""

from __future__ import annotations

import typing

from contracts import Event, EventKind
from tests.fixtures.builders import Thread, ledger_records


def _wire_kinds() -> set[str]:
    union = typing.get_args(Event)[0]
    return {typing.get_args(m.model_fields["kind"].annotation)[0] for m in typing.get_args(union)}


def test_every_kind_the_wire_carries_is_an_event_kind_and_every_event_kind_is_carried() -> None:
    assert _wire_kinds() == {k.value for k in EventKind}


def test_a_records_kind_is_its_events_kind() -> None:
    t = Thread()
    events = [t.system("Be careful."), t.user("Fix the bug."), t.assistant("Looking.")]
    assert [r.kind for r in ledger_records(events)] == [EventKind(e.kind) for e in events]
