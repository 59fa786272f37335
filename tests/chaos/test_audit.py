"""The chaos verdicts themselves: an audit and a report must fail when an invariant does."""

from __future__ import annotations

from contracts import ThreadInspection
from tests.chaos.scenarios import ScenarioReport
from tests.fixtures.audit import ThreadAudit

EXPECTED = ("e1", "e2", "e3", "e4")


def _audit(
    recorded: tuple[str, ...], *, contiguous: bool = True, chain: bool = True, state: bool = True
) -> ThreadAudit:
    inspection = ThreadInspection(
        thread_id="r.main",
        session_id="s",
        revision=len(recorded),
        record_count=len(recorded),
        total_tokens=0,
        last_event_key=recorded[-1] if recorded else None,
        chain_verified=chain,
        chain_error=None if chain else "bad hash",
        pending_call_ids=(),
        dead_letters=0,
        records=(),
        state_verified=state,
    )
    return ThreadAudit("r.main", EXPECTED, recorded, contiguous, inspection)


def test_audit_of_a_ledger_equal_to_the_publish_order_is_ok() -> None:
    audit = _audit(EXPECTED)
    assert audit.ok and not audit.missing and audit.duplicated == 0 and audit.reordered == 0


def test_audit_counts_missing_duplicated_reordered_and_unexpected_records() -> None:
    audit = _audit(("e2", "e1", "e2", "bad-1", "e4"))
    assert not audit.ok
    assert (audit.missing, audit.duplicated, audit.reordered, audit.unexpected) == (("e3",), 1, 1, ("bad-1",))


def test_audit_fails_on_a_seq_gap_a_broken_chain_or_a_diverged_state() -> None:
    assert not _audit(EXPECTED, contiguous=False).chain_ok
    assert not _audit(EXPECTED, chain=False).chain_ok
    assert not _audit(EXPECTED, state=False).replay_ok
    assert not _audit(EXPECTED, state=False).ok


def test_report_fails_on_any_broken_invariant_and_names_it() -> None:
    assert ScenarioReport("worker_kill", "small", events=10).ok
    report = ScenarioReport("worker_kill", "small", events=10, lost=1, stuck=2, dead_letter_errors=1)
    assert not report.ok
    assert report.failures == {"lost": 1, "stuck": 2, "dead_letter_errors": 1}
    assert report.as_json()["ok"] is False
