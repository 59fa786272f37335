"""Which files a tool call read and which it modified, taken from the call itself.

A compaction summary must list the files the covered history touched. Guessing from tool output
is unreliable, so this module looks only at the call: editor-style tools name the file and the
operation in their arguments, and shell lines are parsed with a small, deterministic heuristic
(redirections, ``tee``, ``sed -i``, ``rm``/``mv``/``cp``/``touch``, readers such as ``cat`` and
``grep``, and ``open()`` in inline Python). It is best-effort: shell is too rich to analyse fully,
so anything unrecognised yields nothing rather than a guess, and it never raises. A command
argument counts only if it looks like a path (a ``/`` or a file extension, no globs, ``$(``,
backticks or URLs); redirection targets need no extension since the syntax makes them files.

Paths are kept verbatim — no normalisation, no resolving against a working directory — because
the summary is validated against the covered records: a path is an identifier that must match
the text of the record it came from, and ``./a.py`` and ``a.py`` are only the same file if a cwd
is known, which a pure function does not know.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

__all__ = ["FileAccess", "files_of_call", "files_of_shell"]


@dataclass(frozen=True, slots=True)
class FileAccess:
    """Paths a call read and modified, each in first-seen order without duplicates."""

    read: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()


_PATH_KEYS = ("path", "file", "filename", "file_path", "filepath", "target_file")
_DEST_KEYS = ("new_path", "destination", "dest")
_SUBCOMMAND_KEYS = ("command", "action", "mode", "op")
_MODIFY = frozenset(
    "create create_file write write_file edit edit_file str_replace insert undo_edit append patch"
    " apply_patch replace delete delete_file remove move move_file rename rename_file".split()
)
_MOVE = frozenset({"move", "move_file", "rename", "rename_file"})
_READ = frozenset("view view_file read read_file open open_file cat show get_file search_file".split())
_SHELL_TOOLS = frozenset("bash shell sh run run_command execute exec terminal".split())

_SEPARATOR_CHARS = ";&|<>()\n"
_PY = re.compile(r"python(?:\d+(?:\.\d+)*)?")
_OPEN = re.compile(
    r"""(?<!\w)open\(\s*(['"])(?P<path>[^'"]+)\1\s*(?:,\s*(?:mode\s*=\s*)?(['"])(?P<mode>[^'"]*)\3)?\s*[,)]"""
)
_HEREDOC = re.compile(r"""(?<!<)<<(?!<)-?\s*\\?(['"]?)(?P<delim>\w+)\1""")
_MARK = "\x00heredoc"
_SED_FLAG = re.compile(r"[^ief]*(?P<flag>[ief])(?P<rest>.*)", re.S)
_NOT_A_PATH = re.compile(r"^(?:-|&|/dev/(?:null|std|fd))|\$\(|`|://|[*?\[]")
_WRAPPERS = frozenset({"sudo", "env", "time", "timeout", "nohup", "command", "exec", "nice", "xargs"})
# Options of sudo, nice, timeout and xargs that take a value.
_WRAPPER_ARG_OPTS = frozenset({"-u", "-g", "-n", "-s", "-k", "-I", "-L", "-P", "-d"})
_NONE: frozenset[str] = frozenset()
_HEAD_OPTS = frozenset({"-n", "-c", "--lines", "--bytes"})
_READERS = dict.fromkeys(("cat", "less", "more", "nl", "wc"), _NONE)
_READERS |= dict.fromkeys(("head", "tail"), _HEAD_OPTS)
_GREP_OPTS = frozenset(
    "-e -f -m -A -B -C --regexp --file --max-count --context --after-context --before-context"
    " --include --exclude --exclude-dir".split()
)
_RG_OPTS = _GREP_OPTS | frozenset("-g -t -T -r -M --glob --type --type-not --replace".split())
_GREPS = {"rg": _RG_OPTS} | dict.fromkeys(("grep", "egrep", "fgrep"), _GREP_OPTS)
_WRITERS = {"tee": _NONE, "rm": _NONE, "mv": frozenset({"-S"}), "touch": frozenset({"-d", "-t", "-r"})}


class _Acc:
    """Ordered, de-duplicated collector of read and modified paths."""

    def __init__(self) -> None:
        self.read: dict[str, None] = {}
        self.modified: dict[str, None] = {}

    def add(self, read: Iterable[str] = (), modified: Iterable[str] = ()) -> None:
        self.read.update(dict.fromkeys(read))
        self.modified.update(dict.fromkeys(modified))

    def result(self) -> FileAccess:
        return FileAccess(tuple(self.read), tuple(self.modified))


def files_of_call(name: str, args: Mapping[str, JsonValue]) -> FileAccess:
    """Return the files one tool call read and modified, from its name and parsed arguments."""
    tool = _tool_name(name)
    if tool in _SHELL_TOOLS:
        line = _shell_text(args.get("command")) or _shell_text(args.get("cmd"))
        return files_of_shell(line or _shell_text(args.get("script")) or "")
    paths = [p for key in _PATH_KEYS for p in _strings(args.get(key))]
    if paths:
        verbs = [_tool_name(v) for k in _SUBCOMMAND_KEYS if isinstance(v := args.get(k), str)]
        verb = next((v for v in verbs if v in _MODIFY or v in _READ), tool)
        if verb in _MODIFY:
            dests = [p for key in _DEST_KEYS for p in _strings(args.get(key))] if verb in _MOVE else []
            return FileAccess((), tuple(dict.fromkeys([*paths, *dests])))
        if verb in _READ:
            return FileAccess(tuple(dict.fromkeys(paths)), ())
    line = _shell_text(args.get("cmd")) or _shell_text(args.get("script"))
    return files_of_shell(line) if line else FileAccess()


def files_of_shell(command: str) -> FileAccess:
    """Return the files a shell command line reads and modifies, best-effort and never raising."""
    acc = _Acc()
    try:
        text, bodies = _cut_heredocs(command)
        for argv, redirects in _segments(_tokens(text.replace("\\\n", " "))):
            if argv and argv[0].startswith(_MARK):
                _python_code(bodies[int(argv[0][len(_MARK) :])], acc)
                continue
            _command(argv, acc)
            for op, target in redirects:
                if _plain(target) and not target.isdigit():
                    acc.add(modified=[target] if ">" in op else [], read=[] if ">" in op else [target])
    except Exception:  # noqa: BLE001 - best-effort by contract: a bad line yields what was found so far
        pass
    return acc.result()


def _tool_name(name: str) -> str:
    return re.split(r"__|\.", name.strip().lower())[-1]


def _strings(value: JsonValue) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str) and v]
    return []


def _shell_text(value: JsonValue) -> str | None:
    if isinstance(value, str):
        return value or None
    items = _strings(value)
    if len(items) >= 3 and items[0].rsplit("/", 1)[-1] in {"bash", "sh", "zsh"} and items[1] in {"-c", "-lc"}:
        return items[2]
    return shlex.join(items) if items else None


def _cut_heredocs(command: str) -> tuple[str, list[str]]:
    """Remove heredoc bodies, leaving a marker line for each one fed to a Python interpreter."""
    kept: list[str] = []
    bodies: list[str] = []
    pending: list[tuple[str, bool]] = []
    body: list[str] = []
    for line in command.split("\n"):
        if pending:
            if line.strip() != pending[0][0]:
                body.append(line)
                continue
            if pending.pop(0)[1]:
                kept.append(f"{_MARK}{len(bodies)}")
                bodies.append("\n".join(body))
            body = []
            continue
        kept.append(line)
        for match in _HEREDOC.finditer(line):
            before = re.split(r"&&|\|\||[;|(]", line[: match.start()])[-1].split()
            words = [w for w in before if "=" not in w and w not in _WRAPPERS]
            fed_to_python = bool(words) and _PY.fullmatch(words[0].rsplit("/", 1)[-1]) is not None
            pending.append((match["delim"], fed_to_python))
    return "\n".join(kept), bodies


def _tokens(text: str) -> list[str]:
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=_SEPARATOR_CHARS)
        lexer.whitespace, lexer.whitespace_split, lexer.commenters = " \t\r", True, ""
        return list(lexer)
    except ValueError:
        found = re.findall(r"&&|\|\||&?>>?|<<?|[;|&()\n]|[^\s;|&<>()]+", text)
        return [t.strip("'\"") for t in found]


def _segments(tokens: Sequence[str]) -> Iterable[tuple[list[str], list[tuple[str, str]]]]:
    """Split tokens into simple commands: (argv, [(redirect operator, target)])."""
    argv: list[str] = []
    redirects: list[tuple[str, str]] = []
    stream = iter(tokens)
    for tok in stream:
        if not tok or any(c not in _SEPARATOR_CHARS for c in tok):
            argv.append(tok)
        elif ">" in tok or tok in {"<", "<<", "<<<"}:
            target = next(stream, "")  # a heredoc delimiter or here-string is consumed, not kept
            if ">" in tok or tok == "<":
                redirects.append((tok, target))
        else:
            yield argv, redirects
            argv, redirects = [], []
    yield argv, redirects


def _plain(tok: str) -> bool:
    return bool(tok) and _NOT_A_PATH.search(tok) is None


def _looks_like_path(tok: str) -> bool:
    if not _plain(tok) or re.fullmatch(r"[\d.]+", tok):
        return False
    return "/" in tok or re.search(r"\.[A-Za-z0-9]+$", tok) is not None


def _paths(tokens: Iterable[str]) -> list[str]:
    return [t for t in tokens if _looks_like_path(t)]


def _positional(args: Sequence[str], arg_opts: frozenset[str] = _NONE) -> list[str]:
    """Arguments that are not options or option values (``--`` ends options)."""
    out: list[str] = []
    skip = False
    for i, tok in enumerate(args):
        if skip:
            skip = False
        elif tok == "--":
            return out + list(args[i + 1 :])
        elif tok.startswith("-") and len(tok) > 1:
            skip = tok in arg_opts
        else:
            out.append(tok)
    return out


def _after(args: Sequence[str], options: Iterable[str]) -> list[str]:
    """The values given to any of ``options`` as a separate argument."""
    return [args[i + 1] for i, tok in enumerate(args[:-1]) if tok in options]


def _command(argv: list[str], acc: _Acc) -> None:
    while argv and (argv[0] in _WRAPPERS or "=" in argv[0] and not argv[0].startswith("-")):
        wrapper, argv = argv[0], argv[1:]
        while argv and argv[0].startswith("-"):
            argv = argv[2:] if argv[0] in _WRAPPER_ARG_OPTS else argv[1:]
        argv = argv[1:] if wrapper == "timeout" else argv
    if not argv:
        return
    cmd, args = argv[0].rsplit("/", 1)[-1], argv[1:]
    if cmd in _READERS:
        acc.add(read=_paths(_positional(args, _READERS[cmd])))
    elif cmd in _GREPS:
        explicit = any(a in {"-e", "-f", "--regexp", "--file"} or a.startswith("--regexp=") for a in args)
        acc.add(read=_paths(_positional(args, _GREPS[cmd])[0 if explicit else 1 :]))
    elif cmd == "sed":
        _sed(args, acc)
    elif cmd in {"awk", "gawk", "mawk"}:
        skip_program = 0 if "-f" in args else 1
        acc.add(read=_paths(_positional(args, frozenset({"-F", "-v", "-f"}))[skip_program:]))
    elif cmd in _WRITERS:
        acc.add(modified=_paths(_positional(args, _WRITERS[cmd])))
    elif cmd == "cp":
        sources = _positional(args, frozenset({"-t", "--target-directory", "-S"}))
        given = _after(args, {"-t", "--target-directory"})
        target, sources = (given, sources) if given else (sources[-1:], sources[:-1])
        acc.add(read=_paths(sources), modified=_paths(target))
    elif cmd == "git" and args[:1] == ["apply"]:
        acc.add(read=_paths(_positional(args[1:])))
    elif cmd == "patch":
        acc.add(read=_paths([*_after(args, {"-i"}), *(a[8:] for a in args if a.startswith("--input="))]))
    elif _PY.fullmatch(cmd):
        _python(args, acc)
    elif cmd in {"bash", "sh", "zsh"}:
        inline = _after(args, {"-c", "-lc"})
        found = files_of_shell(inline[0]) if inline else FileAccess(tuple(_paths(_positional(args)[:1])))
        acc.add(found.read, found.modified)


def _sed(args: Sequence[str], acc: _Acc) -> None:
    in_place = has_script = False
    positional: list[str] = []
    stream = iter(args)
    for tok in stream:
        if tok.startswith("--in-place"):
            in_place = True
        elif tok.startswith(("--expression", "--file")):
            has_script = True
            if "=" not in tok:
                next(stream, None)
        elif tok.startswith("-") and not tok.startswith("--") and len(tok) > 1:
            found = _SED_FLAG.match(tok[1:])  # -i takes a glued suffix, -e/-f a glued or next value
            if found and found["flag"] == "i":
                in_place = True
            elif found:
                has_script = True
                if not found["rest"]:
                    next(stream, None)
        elif tok:  # an empty token is BSD sed's `-i ''` suffix
            positional.append(tok)
    files = _paths(positional if has_script else positional[1:])
    acc.add(read=[] if in_place else files, modified=files if in_place else [])


def _python(args: Sequence[str], acc: _Acc) -> None:
    while args and args[0].startswith("-") and not args[0].startswith(("-c", "-m")):
        args = args[2:] if args[0] in {"-W", "-X"} else args[1:]
    if args and args[0] == "-c":
        _python_code(" ".join(args[1:2]), acc)
    elif args and not args[0].startswith("-"):
        acc.add(read=_paths(args[:1]))


def _python_code(code: str, acc: _Acc) -> None:
    for match in _OPEN.finditer(code):
        path, mode = match["path"], match["mode"]
        if _plain(path):
            writes = mode is not None and any(c in mode for c in "wax+")
            acc.add(read=[path] if mode is None or "r" in mode else [], modified=[path] if writes else [])
