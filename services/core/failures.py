"""Whether a tool call failed, and the line that tells how: one rule for the summary, the eval's
error probe and the reductions that keep a failure's telling line.

A call failed when its recorded status says so, or when its output shows a failure the status
missed (a command piped through ``head`` exits 0 while printing a traceback; a test runner's exit
code is lost the same way). Reading a failure into an output is conservative, because a false
failure in the summary misleads the model for the rest of the thread while a missed one only
leaves the output as it was:

1. Only a call that runs something can fail by its output: a shell command with a runner in it
   (``python``, ``pytest``, ``make``, ``cargo``, ``go``, ``npm``, a ``./script``…), or a tool
   without a command or path whose output starts with ``Error:`` (a function tool reporting its
   own refusal). Viewing a file (``cat``, ``grep``, ``sed -n``, an editor's ``view``) never is,
   whatever the file says.
2. A Python traceback counts when it ends the output: its exception line is among the last
   lines, or the output is cut inside the traceback. One printed and then carried on from (a
   script catching its exception and going on to report) does not.
3. A test runner's failure summary, a compiler's ``error:`` lines, ``npm ERR!``: the telling line
   is the failing test or the first error, as a reader fixing it would quote.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import JsonValue

from contracts import ToolStatus

from services.core.render import telling_line

__all__ = ["Call", "Failure", "failure_of", "shell_command"]

_PATH_KEYS = ("path", "file", "filename", "file_path", "filepath", "target_file")
_COMMAND_KEYS = ("command", "cmd", "script")
# Programs that run code, tests or builds; anything else (cat, grep, sed, ls, git…) only shows.
_RUNNERS = frozenset(
    "pytest py.test tox nox make cmake ninja cargo rustc go npm npx yarn pnpm node deno bun tsc jest "
    "mocha vitest gcc g++ cc clang clang++ javac java mvn gradle gradlew sh bash zsh ruby rspec rake "
    "bundle php phpunit dotnet swift uv poetry pipenv coverage mypy pyright django-admin".split()
)
_PYTHON = re.compile(r"^python[\d.]*$")
# Where one program of a command line starts: a new line, a pipe, `;`, `&&`, `||`, a subshell.
_SEGMENTS = re.compile(r"\n|\|\|?|&&|;|\(|\)|`|\$\(")
_ASSIGNMENT = re.compile(r"^\w+=")
_PREFIXES = frozenset({"sudo", "env", "time", "nohup", "exec", "timeout"})
# Lines an agent harness wraps around an output: they say nothing about what the command did.
_NOISE = re.compile(
    r"^(?:</?output>|<returncode>-?\d+</returncode>|</?returncode>|\(Open file: .*\)|"
    r"\(Current directory: .*\)|bash-\$|\$)$"
)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):?$")
# An exception line naming its class as Python prints it, or as pytest prefixes it with "E".
_EXCEPTION = re.compile(
    r"^(?:E\s+)?(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$"
)
# How far from the end a traceback's exception line may sit and still be what ended the run:
# the harness's own lines are dropped before, and a script may print a line on its way out.
_TAIL_LINES = 3
# A test runner's failing test: pytest, unittest/Django, Go, Rust, Jest.
_FAILING_TEST = re.compile(
    r"^(?:FAILED\s+\S+::\S+.*|(?:FAIL|ERROR): \w+ \(\S+\).*|--- FAIL: \S+.*|"
    r"test \S+ \.\.\. FAILED|●\s+.+ › .+)$"
)
# A runner's closing tally of a failed run.
_RUNNER_TALLY = re.compile(
    r"^(?:=+ .*\b\d+ (?:failed|errors?)\b.*=+|FAILED \((?:failures|errors)=\d+.*\)|"
    r"test result: FAILED\..*|FAIL\s+\S+\s+[\d.]+s|FAIL|Tests?:\s+\d+ failed.*)$"
)
# A compiler's or checker's error line: `file:3:5: error: …`, `error[E0308]: …`, `error TS2322: …`.
_COMPILER_ERROR = re.compile(
    r"^(?:\S+?:\d+(?::\d+)?:\s+|\S+\(\d+,\d+\):\s+)?(?:fatal )?error(?:\[\w+\]|\s+TS\d+)?:\s+\S"
)
_NPM_ERROR = re.compile(r"^npm ERR! ")
_TOOL_ERROR = re.compile(r"^(?:Error|ERROR|error):\s+\S")
# What ends a traceback: the raised class, dotted, with its message (``Product.DoesNotExist: …``).
_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::\s.*)?$")
_MAX_LINE = 300


class Call(Protocol):
    """A tool call as recorded: its tool's name and its arguments."""

    @property
    def name(self) -> str: ...

    @property
    def args(self) -> Mapping[str, JsonValue]: ...


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed call: the status it counts as, the line that tells how, and what showed it."""

    status: Literal[ToolStatus.ERROR, ToolStatus.TIMEOUT, ToolStatus.UNKNOWN]
    # Empty when a status-reported failure printed nothing telling: the caller words it.
    line: str
    shown_by: Literal["status", "output"]


def shell_command(args: Mapping[str, JsonValue]) -> str:
    """The command line of a shell-style call ("" for an editor call, which names a file)."""
    if any(isinstance(args.get(k), str) for k in _PATH_KEYS):
        return ""
    for key in _COMMAND_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            items = [str(v) for v in value]
            return items[2] if len(items) >= 3 and items[1] in {"-c", "-lc"} else shlex.join(items)
    return ""


def failure_of(call: Call | None, status: ToolStatus, text: str) -> Failure | None:
    """How the call ``call`` with outcome ``status`` and output ``text`` failed, or None when it did not.

    ``call`` is None when the call is not known (its record is elsewhere): then only the status
    tells, as nothing says what the output is.
    """
    match status:
        case ToolStatus.SUCCESS:
            pass
        case ToolStatus.ERROR | ToolStatus.TIMEOUT | ToolStatus.UNKNOWN:
            # The status already says it failed: the reductions' line, which looks at any error word.
            return Failure(status=status, line=telling_line(text) or "", shown_by="status")
    if call is None:
        return None
    lines = _meaningful(text)
    command = shell_command(call.args)
    if command:
        line = _runner_failure(lines) if _runs_something(command) else None
    elif not any(isinstance(call.args.get(k), str) for k in _PATH_KEYS):
        line = lines[0] if lines and _TOOL_ERROR.match(lines[0]) else None
    else:
        line = None
    return None if line is None else Failure(status=ToolStatus.ERROR, line=_clip(line), shown_by="output")


def _runs_something(command: str) -> bool:
    for segment in _SEGMENTS.split(command):
        try:
            words = shlex.split(segment, comments=True)
        except ValueError:  # an unbalanced quote: a segment inside a quoted script
            words = segment.split()
        words = [w for w in words if not _ASSIGNMENT.match(w)]
        while words and words[0] in _PREFIXES:
            words = words[1:]
            if words and words[0].replace(".", "").isdigit():  # `timeout 60 …`
                words = words[1:]
        if not words or len(words) > 1 and words[1][:1] in "=(:.[":
            continue  # a line of code (`node = …`) in a heredoc, a `-c` script or an editor's edit
        program = words[0].rsplit("/", 1)[-1]
        if program in _RUNNERS or _PYTHON.match(program) or words[0].startswith("./"):
            return True
    return False


def _runner_failure(lines: Sequence[str]) -> str | None:
    """The telling line of a failure the output shows, or None when it shows none."""
    if tests := [line for line in lines if _FAILING_TEST.match(line)]:
        return tests[-1]
    if errors := [line for line in lines if _COMPILER_ERROR.match(line) or _NPM_ERROR.match(line)]:
        return errors[0]  # the first error is the cause; the ones after often follow from it
    if traceback := _traceback_line(lines):
        return traceback
    if lines and _EXCEPTION.match(lines[-1]):
        return lines[-1]  # the traceback filtered out (`| grep`, `| tail -1`) but what it raised
    return next((line for line in reversed(lines[-_TAIL_LINES:]) if _RUNNER_TALLY.match(line)), None)


def _traceback_line(lines: Sequence[str]) -> str | None:
    """The exception line of a traceback that ends the output (rule 2)."""
    start = next((i for i in range(len(lines) - 1, -1, -1) if _TRACEBACK.match(lines[i])), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if _RAISED.match(lines[i])), None)
    if end is None:
        # Cut inside the traceback (`| head`, `| grep -A`): the frames run to the end; an earlier
        # exception line of a chained traceback is what was raised.
        if not all(_is_frame(line) for line in lines[start + 1 :]):
            return None
        return next((line for line in reversed(lines[:start]) if _RAISED.match(line)), lines[-1])
    return lines[end] if len(lines) - end <= _TAIL_LINES else None


def _is_frame(line: str) -> bool:
    # The lines of a frame as shown once stripped: `File "…", line N, in f`, its source, carets.
    return line.startswith('File "') or not line[:1].isupper() or set(line) <= {"^", "~", " "}


def _meaningful(text: str) -> list[str]:
    return [s for raw in text.splitlines() if (s := raw.strip()) and not _NOISE.match(s)]


def _clip(line: str) -> str:
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 1] + "…"
