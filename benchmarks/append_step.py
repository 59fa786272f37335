"""Assembly after one new record, as a thread grows: its cost should follow what changed.

Nearly every prepare follows a new record (the runtime publishes, then prepares naming it), so the
figure that matters is not a prepare of an unchanged view but one right after an append. One thread
of small tool groups (a call and its output, a user message every 10 groups) grows a record at a time
from 40 to 900 records under the gpt-4o profile (no compaction: everything fits); after every record
the thread's view is assembled with the view cache kept across steps (``assemble_reusing``, which
extends the thread's last assembly after an append and answers an unchanged view with the context
it assembled), as the assembler runs it, in this process (no servers: the figure is the assembly
alone). Reported per size band:
p50 / p90 of the step after an append, and of a second prepare of the same view (nothing changed).

``make bench BENCH_ARGS="--only append"``
"""

from __future__ import annotations

import time

from contracts import PrepareRequest
from services.app.view_cache import ViewCache, assemble_reusing
from services.core.assemble import ThreadSnapshot
from services.core.budget import resolve_budget
from services.core.records import LedgerRecord
from services.core.tokens import counter_for
from tests.fixtures.builders import Thread, ledger_records

__all__ = ["bench_append"]

BANDS = ((40, 100), (100, 200), (200, 300), (300, 400), (500, 600), (800, 900))


def _thread(groups: int) -> tuple[Thread, list[LedgerRecord]]:
    t = Thread()
    events = [t.system("You fix bugs."), t.user("Fix the failing test.")]
    for n in range(groups):
        if n and n % 10 == 0:
            events.append(t.user(f"and now step {n}"))
        events.append(t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat f{n}.py"}),)))
        events.append(t.outcome(f"c{n}", f"line {n}\n" * 20))
    return t, ledger_records(events)


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 3),
        "p90_ms": round(ordered[int(len(ordered) * 0.9)] * 1000, 3),
    }


def bench_append() -> dict[str, object]:
    """p50 / p90 of assembly right after an append and of an unchanged view, per size band."""
    t, records = _thread(430)
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, model_profile="gpt-4o"
    )
    budget, counter = resolve_budget(request), counter_for("o200k_base")
    cache = ViewCache()

    def assemble(k: int) -> float:
        view = records[:k]
        snapshot = ThreadSnapshot(
            t.session_id,
            t.run_id,
            t.instance_id,
            k,
            view[-1].seq,
            view[-1].event_key,
            list(view),
            own_thread=t.thread_id,
        )
        started = time.perf_counter()
        assemble_reusing(cache, snapshot, request, budget, counter)
        return time.perf_counter() - started

    appended: dict[tuple[int, int], list[float]] = {band: [] for band in BANDS}
    unchanged: dict[tuple[int, int], list[float]] = {band: [] for band in BANDS}
    for k in range(BANDS[0][0], min(len(records), BANDS[-1][1]) + 1):
        after_append, again = assemble(k), assemble(k)
        for low, high in BANDS:
            if low <= k < high:
                appended[(low, high)].append(after_append)
                unchanged[(low, high)].append(again)
    return {
        f"records_{low}_{high - 1}": {
            "after_one_new_record": _ms(appended[(low, high)]),
            "unchanged_view": _ms(unchanged[(low, high)]),
        }
        for low, high in BANDS
        if appended[(low, high)]
    } | {"records": len(records)}
