"""Failures only the output shows: read from real outputs, and never from a file being viewed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contracts import ToolStatus
from services.core.compaction.structured import summarize_records
from services.core.evaluation import ProbeKind, probes_at
from services.core.failures import Failure, failure_of
from services.core.trace import TraceCall, read_trace

from .test_eval_synthetic import TraceBuilder
from .test_structured_summary import _Trace

_SAMPLES = Path(__file__).resolve().parents[2] / "infra" / "samples"
_DJANGO = "mini-swe-agent-deepseek__deepseek_chat_test_1-100__django__django-13964.jsonl"
_SQLFLUFF = "mini-swe-agent-deepseek__deepseek_chat_dev__sqlfluff__sqlfluff-2419.jsonl"
_PYDICOM = "swe-agent__gpt4_pydicom__pydicom-1458.jsonl"
_MARSHMALLOW = "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"


@dataclass(frozen=True)
class _Call:
    name: str
    args: dict[str, Any]


def _bash(command: str) -> _Call:
    return _Call("bash", {"command": command})


def _sample_outcome(sample: str, line: int) -> tuple[TraceCall, str, ToolStatus]:
    """The call and output recorded at ``line`` of a bundled sample trace."""
    trace = read_trace(_SAMPLES / sample)
    calls = {c.call_id: c for event in trace for c in event.tool_calls}
    outcome = next(event for event in trace if event.line == line)
    return calls[outcome.call_id or ""], outcome.text, ToolStatus(outcome.status)


@pytest.mark.parametrize(
    ("sample", "line", "telling"),
    [
        # `python reproduce_bug.py` exits 0 in that harness; the harness's own lines follow.
        (
            _PYDICOM,
            9,
            "AttributeError: Unable to convert the pixel data as the following required elements are "
            "missing from the dataset: PixelRepresentation",
        ),
        # A script piped through `tail`: the exit code is tail's.
        (_DJANGO, 158, "django.db.utils.IntegrityError: FOREIGN KEY constraint failed"),
        # `| grep -A20` cut the chained traceback before its end: the exception it did show.
        (_DJANGO, 208, "sqlite3.IntegrityError: FOREIGN KEY constraint failed"),
        # `| grep -i "…ERROR"` kept only the exception line.
        (_SQLFLUFF, 68, "NameError: name 'test_rules' is not defined. Did you mean: 'get_ruleset'?"),
    ],
)
def test_failure_of_a_run_that_exits_0_is_read_from_its_output_with_the_exception_line(
    sample: str, line: int, telling: str
) -> None:
    call, text, status = _sample_outcome(sample, line)
    assert status is ToolStatus.SUCCESS
    assert failure_of(call, status, text) == Failure(ToolStatus.ERROR, telling, "output")


@pytest.mark.parametrize(
    ("sample", "line"),
    [
        (_DJANGO, 24),  # `sed -n '771,850p' …/related.py`: code that raises errors
        (_DJANGO, 236),  # `grep -n "def __set__" … -A 50`: the same
        (_PYDICOM, 13),  # the editor's `open` on the line that raises AttributeError
        (_MARSHMALLOW, 20),  # a function-calling `open` of a path
        # A script that printed a caught exception's traceback, then went on to report.
        (_DJANGO, 74),
        # A script reporting the error it caught as "Error: …": it ran as written.
        (_DJANGO, 266),
    ],
)
def test_failure_of_an_output_that_merely_contains_an_error_is_none(sample: str, line: int) -> None:
    call, text, status = _sample_outcome(sample, line)
    assert status is ToolStatus.SUCCESS and ("Error" in text or "Traceback" in text)
    assert failure_of(call, status, text) is None


# A real output (SWE-agent/mini-swe-agent, marshmallow-1359): pytest through `| head -50`, exit 0.
_PYTEST_CONFTEST = (
    "<returncode>0</returncode>\n<output>\n"
    "ImportError while loading conftest '/testbed/tests/conftest.py'.\n"
    "tests/conftest.py:4: in <module>\n"
    "    from tests.base import User, UserSchema, Blog\n"
    "tests/base.py:5: in <module>\n"
    "    import simplejson\n"
    "E   ModuleNotFoundError: No module named 'simplejson'\n"
    "</output>"
)


def test_failure_of_pytest_cut_by_head_is_its_error_line() -> None:
    command = 'cd /testbed && python -m pytest tests/ -xvs -k "date" 2>&1 | head -50'
    got = failure_of(_bash(command), ToolStatus.SUCCESS, _PYTEST_CONFTEST)
    assert got == Failure(ToolStatus.ERROR, "E   ModuleNotFoundError: No module named 'simplejson'", "output")


_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "app.py", line 3, in <module>\n'
    "    main()\n"
    "ValueError: bad config key 'port'\n"
)


def test_failure_of_viewing_a_file_that_ends_in_a_traceback_is_none() -> None:
    for command in ("cat crash.log", "tail -n 20 crash.log", "grep -n Traceback -A3 crash.log | head"):
        assert failure_of(_bash(command), ToolStatus.SUCCESS, _TRACEBACK) is None
    assert (
        failure_of(
            _Call("str_replace_editor", {"command": "view", "path": "crash.log"}),
            ToolStatus.SUCCESS,
            _TRACEBACK,
        )
        is None
    )


def test_failure_of_an_edit_whose_code_names_a_runner_is_none() -> None:
    # SWE-agent's `edit` carries the new code in its command; `node = …` is code, not node.js.
    edit = _Call("edit", {"command": "edit 1:3\nnode = parse(text)\ngo = True\nend_of_edit"})
    assert failure_of(edit, ToolStatus.SUCCESS, _TRACEBACK) is None


def test_failure_of_a_run_names_the_exception_that_ended_it() -> None:
    got = failure_of(_bash("cd /app && python app.py 2>&1 | head -40"), ToolStatus.SUCCESS, _TRACEBACK)
    assert got == Failure(ToolStatus.ERROR, "ValueError: bad config key 'port'", "output")


@pytest.mark.parametrize(
    ("command", "output", "telling"),
    [
        (
            "python -m pytest tests/ -q 2>&1 | tail -5",
            "FAILED tests/test_dates.py::test_parse_iso - AssertionError: assert None == 3\n"
            "1 failed, 11 passed in 0.42s",
            "FAILED tests/test_dates.py::test_parse_iso - AssertionError: assert None == 3",
        ),
        (
            "python -m pytest tests/ 2>&1 | tail -3",
            "collected 12 items\n\n========== 2 failed, 10 passed in 1.20s ==========",
            "========== 2 failed, 10 passed in 1.20s ==========",
        ),
        (
            "./runtests.py dates --verbosity 2 | tail",
            "ERROR: test_parse (dates.tests.ParseTests)\n----\nRan 4 tests in 0.01s\n\nFAILED (errors=1)",
            "ERROR: test_parse (dates.tests.ParseTests)",
        ),
        (
            "go test ./... | cat",
            "--- FAIL: TestParse (0.00s)\n    parse_test.go:12: got 4, want 3\n"
            "FAIL\nFAIL\texample.com/dates\t0.01s",
            "--- FAIL: TestParse (0.00s)",
        ),
        (
            "cargo test 2>&1 | tail -20",
            "running 2 tests\ntest tests::parses ... FAILED\ntest tests::formats ... ok\n\n"
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "test tests::parses ... FAILED",
        ),
        (
            "cargo build 2>&1 | head -20",
            "   Compiling dates v0.1.0\nerror[E0308]: mismatched types\n --> src/lib.rs:3:5\n"
            "error: could not compile `dates` due to previous error",
            "error[E0308]: mismatched types",
        ),
        (
            "make 2>&1 | head",
            "cc -c parse.c\nparse.c:12:5: error: use of undeclared identifier 'n'\n1 error generated.",
            "parse.c:12:5: error: use of undeclared identifier 'n'",
        ),
        (
            "npx jest 2>&1 | tail -20",
            "FAIL src/dates.test.js\n  ● dates › parses iso\n\n    expect(received).toBe(expected)\n"
            "Tests:       1 failed, 3 passed, 4 total",
            "● dates › parses iso",
        ),
        (
            "npm test || true",
            "> dates@1.0.0 test\nnpm ERR! code ELIFECYCLE\nnpm ERR! errno 1",
            "npm ERR! code ELIFECYCLE",
        ),
    ],
)
def test_failure_of_a_runner_names_the_failing_test_or_the_first_error(
    command: str, output: str, telling: str
) -> None:
    assert failure_of(_bash(command), ToolStatus.SUCCESS, output) == Failure(
        ToolStatus.ERROR, telling, "output"
    )


def test_failure_of_a_passing_run_that_prints_error_words_is_none() -> None:
    output = "test_errors.py::test_raises_value_error PASSED\n1 passed in 0.10s"
    assert failure_of(_bash("pytest -q test_errors.py"), ToolStatus.SUCCESS, output) is None
    assert failure_of(_bash("grep -rn 'FAILED' ci.log"), ToolStatus.SUCCESS, "FAILED (errors=1)") is None


def test_failure_of_a_function_tool_reporting_its_own_refusal_starts_with_error() -> None:
    # tau-bench's airline tools answer a refused booking as text, status success.
    booking = _Call("book_reservation", {"user_id": "noah_muller_9847", "cabin": "economy"})
    refusal = "Error: payment amount does not add up, total price is 1002, but paid 957"
    assert failure_of(booking, ToolStatus.SUCCESS, refusal) == Failure(ToolStatus.ERROR, refusal, "output")
    assert failure_of(booking, ToolStatus.SUCCESS, '{"reservation_id": "HATHAT", "status": "ok"}') is None


def test_failure_of_a_failed_status_keeps_it_and_of_an_unknown_call_reads_nothing() -> None:
    got = failure_of(_bash("pytest"), ToolStatus.TIMEOUT, "collecting ...")
    assert got is not None and got.status is ToolStatus.TIMEOUT and got.shown_by == "status"
    assert failure_of(None, ToolStatus.SUCCESS, _TRACEBACK) is None


def test_error_probe_counts_a_failure_only_the_output_shows_until_the_same_command_succeeds() -> None:
    t = TraceBuilder().system("agent").user("Make app.py start.")
    t.bash("c1", "cat app.py", _TRACEBACK)
    assert [p for p in probes_at(t.lines) if p.kind is ProbeKind.LAST_ERROR] == []
    t.bash("c2", "python app.py 2>&1 | head", _TRACEBACK)
    errors = [p.text for p in probes_at(t.lines) if p.kind is ProbeKind.LAST_ERROR]
    assert errors == ["ValueError: bad config key 'port'"]
    t.bash("c3", "python app.py 2>&1 | head", "started")
    assert [p for p in probes_at(t.lines) if p.kind is ProbeKind.LAST_ERROR] == []


def test_summary_lists_a_failure_only_the_output_shows_and_not_a_viewed_traceback() -> None:
    t = _Trace()
    t.user("Make app.py start.")
    t.run("c1", "cat crash.log", _TRACEBACK)
    t.run("c2", "python app.py 2>&1 | head", _TRACEBACK)
    summary = summarize_records(t.records)
    assert [(f.call_id, f.status, f.detail) for f in summary.failures] == [
        ("c2", "error", "ValueError: bad config key 'port'")
    ]
