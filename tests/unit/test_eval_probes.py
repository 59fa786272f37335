"""Probes: what the next step needs, read from the trace, and whether a context shows it."""

from __future__ import annotations

from services.core.evaluation import Probe, ProbeKind, haystack_of, history_of, is_present, probes_at
from services.core.evaluation.chat import ChatMsg
from services.core.evaluation.probes import constraints_of, head_line, telling_line

from .test_eval_synthetic import TraceBuilder


def _of(kind: ProbeKind, probes: list[Probe]) -> list[str]:
    return [p.text for p in probes if p.kind == kind]


def _coding() -> TraceBuilder:
    t = (
        TraceBuilder()
        .system("agent")
        .user("Fix the date parser. You must not change the public API. Never touch tests/.")
    )
    t.bash("c1", "cat src/dates.py", "<returncode>0</returncode>\n<output>\ndef parse(s):\n</output>")
    t.call(
        "edit it",
        (
            "c2",
            "str_replace_editor",
            {"command": "str_replace", "path": "src/dates.py", "old_str": "a", "new_str": "b"},
        ),
    )
    t.result("c2", "The file src/dates.py has been edited.")
    t.bash("c3", "sed -i 's/x/y/' src/util.py", "")
    return t


def test_files_written_and_read_are_probes_from_the_calls() -> None:
    probes = probes_at(_coding().lines)
    assert _of(ProbeKind.FILES_WRITTEN, probes) == ["src/dates.py", "src/util.py"]
    assert _of(ProbeKind.FILES_READ, probes) == ["src/dates.py"]


def test_a_context_naming_a_written_file_passes_and_one_without_it_fails() -> None:
    [probe] = [p for p in probes_at(_coding().lines) if p.text == "src/util.py"]
    naming: list[ChatMsg] = [{"role": "user", "content": "Summary: files modified: src/util.py (sed)"}]
    silent: list[ChatMsg] = [{"role": "user", "content": "Summary: files modified: src/dates.py"}]
    assert is_present(probe, haystack_of(naming))
    assert not is_present(probe, haystack_of(silent))


def test_a_file_named_only_in_a_tool_call_argument_is_present() -> None:
    [probe] = [p for p in probes_at(_coding().lines) if p.text == "src/util.py"]
    context: list[ChatMsg] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"sed -i \'s/x/y/\' src/util.py"}'},
                }
            ],
        }
    ]
    assert is_present(probe, haystack_of(context))


def test_the_task_is_the_first_user_input_verbatim_and_whitespace_is_normalized() -> None:
    t = _coding().user("Also: only use the standard library.")
    [task] = _of(ProbeKind.TASK, probes_at(t.lines))
    assert task.startswith("Fix the date parser.")
    reflowed: list[ChatMsg] = [
        {
            "role": "user",
            "content": "Fix the date parser.\n  You must not change the public API.\nNever touch   tests/.",
        }
    ]
    assert is_present(Probe(ProbeKind.TASK, task, 2), haystack_of(reflowed))
    assert not is_present(
        Probe(ProbeKind.TASK, task, 2), haystack_of([{"role": "user", "content": "Fix the date parser."}])
    )


def test_constraints_are_the_user_sentences_with_must_never_only() -> None:
    t = _coding().user("Thanks. Please only use the standard library! That is all.")
    assert _of(ProbeKind.CONSTRAINTS, probes_at(t.lines)) == [
        "You must not change the public API.",
        "Never touch tests/.",
        "Please only use the standard library!",
    ]
    assert constraints_of("Sure. Go ahead.") == []


def test_the_last_error_stays_a_probe_until_the_same_command_succeeds() -> None:
    t = _coding().bash(
        "c4", "pytest -q", "F.\nE   AssertionError: 2 != 3\n1 failed, 1 passed", status="error"
    )
    assert _of(ProbeKind.LAST_ERROR, probes_at(t.lines)) == ["1 failed, 1 passed"]
    t.bash("c5", "ls", "src tests")  # another command succeeding does not clear it
    assert _of(ProbeKind.LAST_ERROR, probes_at(t.lines)) == ["1 failed, 1 passed"]
    t.bash("c6", "pytest -q", "2 passed")
    assert _of(ProbeKind.LAST_ERROR, probes_at(t.lines)) == []


def test_telling_line_is_the_last_line_naming_an_error_else_the_first_line() -> None:
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1\nModuleNotFoundError: '
        "No module named 'asgiref'\n</output>"
    )
    assert telling_line(traceback) == "ModuleNotFoundError: No module named 'asgiref'"
    assert telling_line("<returncode>2</returncode>\nno such file\nsecond") == "no such file"


def test_head_of_the_last_outcome_skips_return_code_tags_and_the_echoed_command() -> None:
    assert head_line("<returncode>0</returncode>\n<output>\n$ ls -la\ntotal 176\n", "ls -la") == "total 176"
    t = _coding().bash("c7", "python run.py", "<returncode>0</returncode>\n<output>\nok: 3 rows\n</output>")
    assert _of(ProbeKind.LAST_OUTCOME, probes_at(t.lines)) == ["ok: 3 rows"]
    t.bash("c8", "true", "<returncode>0</returncode>\n<output>\n</output>")
    assert _of(ProbeKind.LAST_OUTCOME, probes_at(t.lines)) == []  # nothing informative to look for


def test_the_full_history_shows_every_probe() -> None:
    t = _coding().bash("c4", "pytest -q", "E   AssertionError: 2 != 3\n1 failed", status="error")
    shown = haystack_of(history_of(t.lines).messages())
    assert all(is_present(p, shown) for p in probes_at(t.lines))
