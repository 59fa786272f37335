"""The deterministic structured summarizer (the default): built from the typed records themselves.

No model, fully reproducible: statements are copied from the records (identifiers verbatim) and
every one keeps the seqs it came from. What it extracts (seed 003 §7): goal and current request,
constraints quoted from the user, decisions the model stated, progress per tool group, files read
and modified (from tool arguments and shell commands), tool failures with their real status,
unresolved questions, next steps, and references to externalized results.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from pydantic import JsonValue

from ..records import LedgerRecord
from .files import files_of_call
from .model import FileTouch, Segment, SourcedText, StructuredSummary, ToolFailure

__all__ = ["StructuredSummarizer", "summarize_records"]

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_CONSTRAINT = re.compile(
    r"\b(must|must not|never|always|do not|don't|only|should not|shouldn't|without|make sure|ensure|required?)\b|必须|不要|不得|务必",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(I will|I'll|let me|let's|I am going to|I'm going to|decided?|instead|the (fix|issue|problem|cause) is|I need to|next,? I)\b",
    re.IGNORECASE,
)
_BLOB_REF = re.compile(r"ctx://blob/[0-9a-f]{64}")
_MAX_ITEM = 400


def _clip(text: str, limit: int = _MAX_ITEM) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sentences(text: str) -> Iterator[str]:
    for part in _SENTENCE.split(text):
        part = part.strip()
        if part:
            yield part


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _error_line(text: str) -> str:
    """The most telling line of a failed tool's output: the last line naming an error, else the first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    flagged = [line for line in lines if re.search(r"error|exception|traceback|failed|fatal|denied|not found", line, re.I)]
    return _clip(flagged[-1] if flagged else (lines[0] if lines else "(no output)"), 300)


def _calls(record: LedgerRecord) -> list[dict[str, JsonValue]]:
    raw = record.payload.get("tool_calls") or []
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


def _args_brief(args: JsonValue) -> str:
    if isinstance(args, dict):
        for key in ("cmd", "command", "path", "file", "query", "url"):
            value = args.get(key)
            if isinstance(value, str):
                return _clip(value, 160)
        return _clip(", ".join(f"{k}={v}" for k, v in args.items()), 160)
    return _clip(str(args), 160)


def summarize_records(records: Sequence[LedgerRecord], *, current_request: LedgerRecord | None = None) -> StructuredSummary:
    """The structured summary of ``records`` (whole groups, in seq order)."""
    calls: dict[str, tuple[LedgerRecord, dict[str, JsonValue]]] = {}
    goal: SourcedText | None = None
    request: SourcedText | None = None
    constraints: list[SourcedText] = []
    decisions: list[SourcedText] = []
    progress: list[SourcedText] = []
    read: dict[str, list[int]] = {}
    modified: dict[str, list[int]] = {}
    failures: list[ToolFailure] = []
    questions: list[SourcedText] = []
    references: list[str] = []
    last_assistant: LedgerRecord | None = None

    for record in records:
        if record.kind == "user_input":
            item = SourcedText(text=_clip(record.text, 600) or "(empty)", sources=(record.seq,))
            if record.payload.get("intent", "question") == "question":
                goal = goal or item
                request = item
            constraints += [SourcedText(text=_clip(s), sources=(record.seq,)) for s in _sentences(record.text) if _CONSTRAINT.search(s)]
            questions += [SourcedText(text=_clip(s), sources=(record.seq,)) for s in _sentences(record.text) if s.endswith("?")]
        elif record.kind == "assistant_message":
            last_assistant = record
            decisions += [SourcedText(text=_clip(s), sources=(record.seq,)) for s in _sentences(record.text) if _DECISION.search(s)][:2]
            for call in _calls(record):
                call_id, name, args = str(call.get("call_id")), str(call.get("name")), call.get("args") or {}
                calls[call_id] = (record, call)
                access = files_of_call(name, args if isinstance(args, dict) else {})
                for path in access.read:
                    read.setdefault(path, []).append(record.seq)
                for path in access.modified:
                    modified.setdefault(path, []).append(record.seq)
            if not _calls(record) and record.text.strip():
                progress.append(SourcedText(text=_clip("replied: " + record.text, 200), sources=(record.seq,)))
        elif record.kind == "tool_outcome":
            call_id = str(record.payload.get("call_id"))
            status = str(record.payload.get("status", "success"))
            origin, call = calls.get(call_id, (None, {}))
            name = str(call.get("name", "?"))
            sources = (origin.seq, record.seq) if origin else (record.seq,)
            step = f"{name}({_args_brief(call.get('args'))}) → {status}: {_clip(_first_line(record.text), 160)}"
            progress.append(SourcedText(text=step, sources=sources))
            if status != "success":
                failures.append(
                    ToolFailure(call_id=call_id, name=name, status=status, detail=_error_line(record.text), sources=sources)
                )
            references += [r for r in _BLOB_REF.findall(record.text) if r not in references]
        elif record.kind in ("resource_activated", "child_result"):
            progress.append(SourcedText(text=_clip(f"{record.kind}: {record.text or record.payload}", 300), sources=(record.seq,)))

    if current_request is not None:
        request = SourcedText(text=_clip(current_request.text, 1200) or "(empty)", sources=(current_request.seq,))
    next_steps = _next_steps(last_assistant, failures, records)
    return StructuredSummary(
        covered_from=records[0].seq,
        covered_to=records[-1].seq,
        goal=goal,
        current_request=request,
        constraints=tuple(constraints),
        decisions=tuple(decisions),
        progress=tuple(progress),
        files_read=tuple(FileTouch(path=p, sources=tuple(dict.fromkeys(s))) for p, s in read.items()),
        files_modified=tuple(FileTouch(path=p, sources=tuple(dict.fromkeys(s))) for p, s in modified.items()),
        failures=tuple(failures),
        unresolved=tuple(questions[-5:]),
        next_steps=next_steps,
        references=tuple(references),
    )


def _next_steps(last: LedgerRecord | None, failures: list[ToolFailure], records: Sequence[LedgerRecord]) -> tuple[SourcedText, ...]:
    steps: list[SourcedText] = []
    if last is not None and last.text.strip():
        steps.append(SourcedText(text=_clip("continue from the last stated intent: " + last.text, 300), sources=(last.seq,)))
    if failures and failures[-1].sources[-1] == records[-1].seq:
        f = failures[-1]
        steps.append(SourcedText(text=f"resolve the failed {f.name} call {f.call_id}: {f.detail}", sources=f.sources))
    if not steps:
        steps.append(SourcedText(text=f"continue the task after record {records[-1].seq}", sources=(records[-1].seq,)))
    return tuple(steps)


class StructuredSummarizer:
    """The default summarizer: deterministic, no model, never too long for its input."""

    name = "structured"

    def __init__(self, current_request: LedgerRecord | None = None) -> None:
        self._current_request = current_request

    async def summarize(self, segment: Segment) -> StructuredSummary:
        """Summarize one segment."""
        return summarize_records(segment.records, current_request=self._current_request)
