"""The deterministic structured summarizer (the default): a progress ledger built from the typed records.

No model, fully reproducible: statements are copied from the records (identifiers verbatim) and
every one keeps the seqs it came from. What it extracts: goal and current
request, the user's constraints (whole sentences), decisions and the current hypothesis the model
stated, progress per tool group, files modified with what changed and files read with the range
shown and a hash of what it showed, each distinct command with its run count, last status and
last failure, tool failures with their real status or, when only the output shows one, as errors
(``services.core.failures``; cleared once the same call succeeds later),
the state-changing calls of non-file tools with their arguments verbatim (actions.py says which),
approaches that failed, unresolved questions, next steps, and references to externalized results.
Sentences that carry no information ("Let me check…") are not decisions, and wrapper lines of an
output (``<returncode>0</returncode>``, an echo of the command) are not its snippet.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import assert_never

from pydantic import JsonValue

from contracts import (
    AssistantMessagePayload,
    ChildResultPayload,
    ContextExportPayload,
    ContextResetPayload,
    OperationReconcilePayload,
    PhaseChangePayload,
    ResourceActivatedPayload,
    RunStatusPayload,
    StatePatchPayload,
    SystemPayload,
    ToolCall,
    ToolOutcomePayload,
    ToolStatus,
    UserInputPayload,
)

from services.core.turns import counts_as_turn
from services.core.records import LedgerRecord
from services.core.compaction.actions import action_args, is_action, primary_id
from services.core.compaction.files import files_of_call
from services.core.failures import failure_of, shell_command
from services.core.compaction.model import (
    ActionTaken,
    CommandRun,
    FileTouch,
    FileView,
    Segment,
    SourcedText,
    Status,
    StructuredSummary,
    ToolFailure,
)

__all__ = ["StructuredSummarizer", "call_key", "error_line", "summarize_records"]

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_CONSTRAINT = re.compile(
    r"\b(must|must not|never|always|do not|don't|only|should not|shouldn't|without|make sure|"
    r"ensure|required?)\b|必须|不要|不得|务必",
    re.IGNORECASE,
)
# A decision says what will be done differently or why; announcing the next call is not one.
_DECISION = re.compile(
    r"\b(decided?|decision|instead|the (fix|issue|problem|cause|solution|approach|plan) (is|was|will be)|"
    r"I('ll| will| am going to|'m going to) (change|modify|replace|fix|add|remove|use|implement|update|"
    r"rewrite|refactor|keep|switch|edit|patch)|(we|I) (should|need to|must) (change|modify|replace|fix|add|"
    r"remove|use|implement|update|edit|patch)|next,? I)\b",
    re.IGNORECASE,
)
# "Let me check the file" announces a look, not a decision: it tells a later step nothing.
_FILLER = re.compile(
    r"^(?:(?:ok(?:ay)?|good|great|perfect|excellent|now|first|next|then|so|alright)\b[,.!:]?\s*)*"
    r"(?:let me|let's|i'll|i will|i'm going to|i am going to|i need to|i want to|i should)\s+"
    r"(?:first\s+|now\s+|also\s+|quickly\s+|again\s+|start by\s+)?"
    r"(?:check|look|see|examine|explore|view|read|inspect|find|search|open|start|understand|run|try|verify|"
    r"investigate|take a (?:closer )?look|have a look|get|list|review|analy[sz]e|confirm|test|"
    r"locate|print|show)\b",
    re.IGNORECASE,
)
_HYPOTHESIS = re.compile(
    r"\b(the (root )?(issue|problem|bug|cause|error|failure) (is|was|seems|appears|might|may|lies|comes)|"
    r"I (think|suspect|believe)|(this|that|which) (means|suggests|indicates|explains)|the reason)\b",
    re.IGNORECASE,
)
_CHANGE_COURSE = re.compile(
    r"\b((didn't|did not|doesn't|does not|won't|isn't|wasn't) (work|help|fix|solve|the)|"
    r"still (fail|error|broken|not|the same)|"
    r"(another|different|alternative|other) (approach|way|strategy|fix)|"
    r"instead\b|not the (issue|problem|cause)|revert)",
    re.IGNORECASE,
)
_BLOB_REF = re.compile(r"ctx://blob/[0-9a-f]{64}")
# Lines an agent harness wraps around an output: they say nothing about what the command did.
_NOISE = re.compile(
    r"^(?:</?output>|<returncode>-?\d+</returncode>|</?returncode>|"
    r"\(Open file: .*\)|\(Current directory: .*\)|bash-\$|\$)$"
)
_RETURNCODE = re.compile(r"<returncode>(-?\d+)</returncode>")
_ERROR_CLASS = re.compile(r"^(?:E\s+)?(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
_FAILED_TEST = re.compile(r"^(?:FAILED|ERROR)\s+\S+::\S+|^(?:FAIL|ERROR): \S+")
_FLAGGED = re.compile(
    r"error|exception|failed|fatal|denied|not found|no such file|cannot|can't|syntax|malformed|invalid|"
    r"unexpected|abort|refused|timed? ?out|conflict|\*\*\*\*|^usage:",
    re.IGNORECASE,
)
_ERRORISH = re.compile(r"traceback|failure|assert", re.IGNORECASE)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
_DEF = re.compile(r"\b(?:def|class|function|func|fn)\s+([A-Za-z_]\w*)")
_SED_RANGE = re.compile(r"\bsed\s+-n\s+['\"]?(\d+)\s*,\s*(\d+|\$)\s*p")
_HEAD = re.compile(r"\bhead\s+(?:-n\s*|--lines[= ]|-)(\d+)")
_TAIL = re.compile(r"\btail\s+(?:-n\s*|--lines[= ]|-)(\d+)")
_PATH_KEYS = ("path", "file", "filename", "file_path", "filepath", "target_file")
_MAX_ITEM = 400
_MAX_CONSTRAINT_SENTENCE = 1_000  # a longer "sentence" is pasted material (code, logs), not a constraint
_MAX_CONSTRAINT_CHARS = 1_500  # per user input: whole sentences only, never one cut mid-way
_KEEP_SOURCES = 6


def _clip(text: str, limit: int = _MAX_ITEM) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sentences(text: str) -> Iterator[str]:
    for part in _SENTENCE.split(text):
        part = part.strip()
        if part:
            yield part


def _meaningful_lines(text: str, command: str = "") -> list[str]:
    echo = " ".join(command.split())
    lines = [line.strip() for line in text.splitlines()]
    return [
        line
        for line in lines
        if line and not _NOISE.match(line) and (not echo or " ".join(line.removeprefix("$ ").split()) != echo)
    ]


def _snippet(text: str, command: str = "") -> str:
    lines = _meaningful_lines(text, command)
    return _clip(lines[0], 120) if lines else "(no output)"


def error_line(text: str, command: str = "") -> str:
    """The telling line of a failed call's output: error class and message, failing test, exit status.

    Also the last line that names an error at all (a test runner's "1 failed" tally, a tool's own
    message) when it is neither of those: the line a reader scanning from the end would quote.
    """
    lines = _meaningful_lines(text, command)
    picks = [
        _last(lines, lambda line: bool(_ERROR_CLASS.match(line))),
        _last(lines, lambda line: bool(_FAILED_TEST.match(line))),
        _last(
            lines,
            lambda line: bool(_FLAGGED.search(line) or _ERRORISH.search(line)) and not _TRACEBACK.match(line),
        ),
    ]
    chosen = sorted({i for i in picks if i is not None})
    parts = [_clip(lines[i], 200) for i in chosen] or [_clip(lines[0], 200) if lines else "(no output)"]
    code = _RETURNCODE.search(text)
    if code and code.group(1) != "0":
        parts.append(f"exit status {code.group(1)}")
    return " | ".join(parts)


def _last(lines: Sequence[str], test: Callable[[str], bool]) -> int | None:
    return next((i for i in range(len(lines) - 1, -1, -1) if test(lines[i])), None)


def _status(status: ToolStatus) -> Status:
    match status:
        case ToolStatus.SUCCESS:
            return "success"
        case ToolStatus.ERROR:
            return "error"
        case ToolStatus.TIMEOUT:
            return "timeout"
        case ToolStatus.UNKNOWN:
            return "unknown"
        case _:
            assert_never(status)


def _path_arg(args: Mapping[str, JsonValue]) -> str:
    return next((v for k in _PATH_KEYS if isinstance(v := args.get(k), str) and v), "")


def _args_brief(args: Mapping[str, JsonValue]) -> str:
    for key in ("cmd", "command", "path", "file", "query", "url"):
        value = args.get(key)
        if isinstance(value, str):
            return _clip(value, 120)
    return _clip(", ".join(f"{k}={v}" for k, v in args.items()), 120)


def call_key(name: str, args: Mapping[str, JsonValue]) -> str:
    """What makes two calls "the same tool/command": a later success of the key clears its failures."""
    shell = shell_command(args)
    if shell:
        return _clip(shell, 200)
    path = _path_arg(args)
    verb = next((v for k in ("command", "action", "mode", "op") if isinstance(v := args.get(k), str)), "")
    if path:
        return " ".join(p for p in (name, verb, path) if p)
    return f"{name}({_args_brief(args)})"


def _quote(text: str, limit: int = 50) -> str:
    return "'" + _clip(text, limit).replace("'", "\\'") + "'"


def _change_of(name: str, args: Mapping[str, JsonValue]) -> str:
    """What an edit changed, from its arguments: editor command and target, or the shell command."""
    shell = shell_command(args)
    if shell:
        return "`" + _clip(shell, 120) + "`"
    verb = next((v for k in ("command", "action", "mode", "op") if isinstance(v := args.get(k), str)), name)
    old, new = args.get("old_str"), args.get("new_str")
    old_text, new_text = (old if isinstance(old, str) else ""), (new if isinstance(new, str) else "")
    func = _DEF.search(old_text) or _DEF.search(new_text)
    where = f" in {func.group(1)}()" if func else ""
    if isinstance(old, str):
        return f"{verb}{where} {_quote(old_text)}→{_quote(new_text)}"
    line = args.get("insert_line")
    if isinstance(line, int):
        return f"{verb} after L{line}{where}: {_quote(new_text)}"
    body = args.get("file_text") or args.get("content")
    if isinstance(body, str):
        return f"{verb} ({len(body.splitlines())} lines){where}"
    return verb


def _range_of(args: Mapping[str, JsonValue]) -> str:
    """The part of a file a read asked for, when its arguments say ("" is the whole file)."""
    view = args.get("view_range")
    if isinstance(view, list) and len(view) == 2 and all(isinstance(v, int) for v in view):
        start, end = view
        return f"L{start}-{'end' if end == -1 else end}"
    shell = shell_command(args)
    if found := _SED_RANGE.search(shell):
        return f"L{found.group(1)}-{'end' if found.group(2) == '$' else found.group(2)}"
    if found := _HEAD.search(shell):
        return f"L1-{found.group(1)}"
    if found := _TAIL.search(shell):
        return f"last {found.group(1)}"
    if re.search(r"\b(grep|rg|egrep)\b", shell):
        return "grep"
    return ""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cap(sources: Sequence[int]) -> tuple[int, ...]:
    """At most a handful of citations: the first and the latest (the rest is in the ledger)."""
    unique = tuple(dict.fromkeys(sources))
    return unique if len(unique) <= _KEEP_SOURCES else (unique[0], *unique[-(_KEEP_SOURCES - 1) :])


def _constraints(record: LedgerRecord) -> list[SourcedText]:
    kept: list[SourcedText] = []
    used = 0
    for sentence in dict.fromkeys(_sentences(record.text)):
        if not _CONSTRAINT.search(sentence) or len(sentence) > _MAX_CONSTRAINT_SENTENCE:
            continue
        if used + len(sentence) > _MAX_CONSTRAINT_CHARS:
            break
        used += len(sentence)
        kept.append(SourcedText(text=sentence, sources=(record.seq,)))
    return kept


def _is_decision(sentence: str) -> bool:
    # A sentence ending in ":" introduces the call that follows; progress already records the call.
    return bool(_DECISION.search(sentence)) and not _FILLER.match(sentence) and not sentence.endswith(":")


@dataclass
class _Ledger:
    """The summary being built, as mutable collections in first-seen order."""

    calls: dict[str, tuple[LedgerRecord, ToolCall]] = field(default_factory=dict)
    read: dict[str, list[int]] = field(default_factory=dict)
    views: dict[str, list[FileView]] = field(default_factory=dict)
    modified: dict[str, list[int]] = field(default_factory=dict)
    changes: dict[str, list[SourcedText]] = field(default_factory=dict)
    commands: dict[str, CommandRun] = field(default_factory=dict)
    failures: list[ToolFailure] = field(default_factory=list)
    actions: list[ActionTaken] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    approaches: list[SourcedText] = field(default_factory=list)
    pending_failure: tuple[str, ToolFailure] | None = None
    last_change: SourcedText | None = None

    def call(self, record: LedgerRecord, call: ToolCall) -> None:
        name, args = call.name, call.args
        self.calls[call.call_id] = (record, call)
        access = files_of_call(name, args)
        for path in access.read:
            self.read.setdefault(path, []).append(record.seq)
        for path in access.modified:
            self.modified.setdefault(path, []).append(record.seq)
            change = SourcedText(text=_change_of(name, args), sources=(record.seq,))
            self.changes.setdefault(path, []).append(change)
            self.last_change = SourcedText(text=f"{path}: {change.text}", sources=change.sources)

    def outcome(self, record: LedgerRecord, body: ToolOutcomePayload) -> SourcedText:
        """Record one tool outcome; returns its progress line."""
        call_id = body.call_id
        self.answered.add(call_id)
        origin, call = self.calls.get(call_id, (None, None))
        name, args = (call.name, call.args) if call is not None else ("?", {})
        sources = (origin.seq, record.seq) if origin else (record.seq,)
        key = call_key(name, args) if call is not None else f"{name} {call_id}"
        shell = shell_command(args)
        failed = failure_of(call, body.status, record.text)
        status = _status(failed.status) if failed is not None else "success"
        if status == "success":
            self.failures = [
                f.model_copy(update={"cleared_at": record.seq})
                if f.command == key and f.cleared_at is None
                else f
                for f in self.failures
            ]
            for path in files_of_call(name, args).read if call is not None else ():
                self.views.setdefault(path, []).append(
                    FileView(lines=_range_of(args), sha=_sha(record.text), sources=sources)
                )
        detail = (
            ""
            if failed is None
            else failed.line
            if failed.shown_by == "output"
            else error_line(record.text, shell)
        )
        self._command(key, name, status, detail, sources)
        if call is not None and is_action(name, args):
            self.actions.append(
                ActionTaken(
                    tool=name,
                    args=action_args(args),
                    status=status,
                    result=detail or _snippet(record.text, shell),
                    call_id=call_id,
                    target=primary_id(args),
                    sources=sources,
                )
            )
        if status != "success":
            failure = ToolFailure(
                call_id=call_id, name=name, status=status, detail=detail, sources=sources, command=key
            )
            self.failures.append(failure)
            self.pending_failure = (key, failure)
        return SourcedText(
            text=f"{name}({_args_brief(args)}) → {status}: {_snippet(record.text, shell)}", sources=sources
        )

    def unanswered(self) -> None:
        """Actions whose outcome is not among the records: whether they happened is unknown, not "no"."""
        for call_id, (record, call) in self.calls.items():
            name, args = call.name, call.args
            if call_id not in self.answered and is_action(name, args):
                action = ActionTaken(
                    tool=name,
                    args=action_args(args),
                    status="unknown",
                    result="(no outcome recorded)",
                    call_id=call_id,
                    target=primary_id(args),
                    sources=(record.seq,),
                )
                self.actions.append(action)
        self.actions.sort(key=lambda a: a.sources[0])

    def _command(self, key: str, tool: str, status: Status, detail: str, sources: tuple[int, ...]) -> None:
        before = self.commands.pop(key, None)
        self.commands[key] = CommandRun(
            command=key,
            tool=tool,
            runs=(before.runs if before else 0) + 1,
            status=status,
            last_failure=detail or (before.last_failure if before else ""),
            sources=_cap((*(before.sources if before else ()), *sources)),
        )

    def reaction(self, record: LedgerRecord) -> None:
        """An assistant message after a failure: a change of course makes it a failed approach."""
        if self.pending_failure is None:
            return
        key, failure = self.pending_failure
        self.pending_failure = None
        turn = next((s for s in _sentences(record.text) if _CHANGE_COURSE.search(s)), None)
        edit = self.last_change
        if turn is None and edit is None:
            return
        tried = f"{_clip(edit.text, 100)} then " if edit is not None else ""
        text = f"{tried}`{_clip(key, 80)}` failed: {failure.detail}"
        sources = (*(edit.sources if edit else ()), *failure.sources)
        if turn is not None:
            text += f" — then: {_clip(turn, 160)}"
            sources = (*sources, record.seq)
        self.approaches.append(SourcedText(text=text, sources=tuple(sorted(set(sources)))))
        self.last_change = None


def summarize_records(
    records: Sequence[LedgerRecord], *, current_request: LedgerRecord | None = None
) -> StructuredSummary:
    """The structured summary of ``records`` (whole groups, in seq order)."""
    ledger = _Ledger()
    goal: SourcedText | None = None
    request: SourcedText | None = None
    hypothesis: SourcedText | None = None
    constraints: list[SourcedText] = []
    decisions: list[SourcedText] = []
    progress: list[SourcedText] = []
    questions: list[SourcedText] = []
    references: list[str] = []
    last_assistant: LedgerRecord | None = None

    for record in records:
        body = record.body
        match body:
            case UserInputPayload():
                item = SourcedText(text=_clip(record.text, 600) or "(empty)", sources=(record.seq,))
                if counts_as_turn(body):
                    goal = goal or item
                    request = item
                constraints += _constraints(record)
                questions += [
                    SourcedText(text=_clip(s), sources=(record.seq,))
                    for s in _sentences(record.text)
                    if s.endswith("?")
                ]
            case AssistantMessagePayload():
                # The last message that says something: a bare tool call states no intent.
                last_assistant = record if record.text.strip() else last_assistant
                ledger.reaction(record)
                sentences = list(_sentences(record.text))
                decisions += [
                    SourcedText(text=_clip(s), sources=(record.seq,)) for s in sentences if _is_decision(s)
                ][:2]
                guess = next((s for s in reversed(sentences) if _HYPOTHESIS.search(s)), None)
                hypothesis = (
                    SourcedText(text=_clip(guess, 300), sources=(record.seq,)) if guess else hypothesis
                )
                for call in body.tool_calls:
                    ledger.call(record, call)
                if not body.tool_calls and record.text.strip():
                    progress.append(
                        SourcedText(text=_clip("replied: " + record.text, 200), sources=(record.seq,))
                    )
            case ToolOutcomePayload():
                progress.append(ledger.outcome(record, body))
                references += [r for r in _BLOB_REF.findall(record.text) if r not in references]
            case ResourceActivatedPayload() | ChildResultPayload():
                progress.append(
                    SourcedText(
                        text=_clip(f"{record.kind}: {record.text or record.payload}", 300),
                        sources=(record.seq,),
                    )
                )
            case (
                SystemPayload()
                | RunStatusPayload()
                | ContextExportPayload()
                | ContextResetPayload()
                | StatePatchPayload()
                | OperationReconcilePayload()
                | PhaseChangePayload()
            ):
                pass  # instructions, execution state and exported background are not progress
            case _:
                assert_never(body)

    if current_request is not None:
        request = SourcedText(
            text=_clip(current_request.text, 1200) or "(empty)", sources=(current_request.seq,)
        )
    next_steps = _next_steps(last_assistant, ledger.failures, records)
    ledger.unanswered()
    return StructuredSummary(
        covered_from=records[0].seq,
        covered_to=records[-1].seq,
        goal=goal,
        current_request=request,
        constraints=tuple(dict.fromkeys(constraints)),
        decisions=tuple(decisions),
        progress=tuple(progress),
        files_read=tuple(
            FileTouch(path=p, sources=_cap(s), views=_distinct_views(ledger.views.get(p, [])))
            for p, s in ledger.read.items()
        ),
        files_modified=tuple(
            FileTouch(path=p, sources=_cap(s), changes=tuple(dict.fromkeys(ledger.changes.get(p, [])))[-4:])
            for p, s in ledger.modified.items()
        ),
        failures=tuple(ledger.failures),
        unresolved=tuple(questions[-5:]),
        next_steps=next_steps,
        references=tuple(references),
        commands=tuple(ledger.commands.values()),
        approaches_failed=tuple(ledger.approaches[-8:]),
        hypothesis=hypothesis,
        actions=tuple(ledger.actions),
    )


def _distinct_views(views: Sequence[FileView]) -> tuple[FileView, ...]:
    """One entry per (range, content); a re-read of the same content only adds its citation."""
    merged: dict[tuple[str, str], list[int]] = {}
    for view in views:
        merged.setdefault((view.lines, view.sha), []).extend(view.sources)
    return tuple(FileView(lines=r, sha=h, sources=_cap(s)) for (r, h), s in merged.items())[-3:]


def _next_steps(
    last: LedgerRecord | None, failures: list[ToolFailure], records: Sequence[LedgerRecord]
) -> tuple[SourcedText, ...]:
    steps: list[SourcedText] = []
    if last is not None and last.text.strip():
        steps.append(
            SourcedText(
                text=_clip("continue from the last stated intent: " + last.text, 300), sources=(last.seq,)
            )
        )
    if failures and failures[-1].sources[-1] == records[-1].seq:
        f = failures[-1]
        steps.append(
            SourcedText(text=f"resolve the failed {f.name} call {f.call_id}: {f.detail}", sources=f.sources)
        )
    if not steps:
        steps.append(
            SourcedText(text=f"continue the task after record {records[-1].seq}", sources=(records[-1].seq,))
        )
    return tuple(steps)


class StructuredSummarizer:
    """The default summarizer: deterministic, no model, never too long for its input."""

    name = "structured"

    def __init__(self, current_request: LedgerRecord | None = None) -> None:
        self._current_request = current_request

    async def summarize(self, segment: Segment) -> StructuredSummary:
        """Summarize one segment."""
        return summarize_records(segment.records, current_request=self._current_request)
