"""Files read and modified, taken from tool calls: editor tools and best-effort shell parsing."""

from __future__ import annotations

import pytest
from pydantic import JsonValue

from services.core.compaction.files import FileAccess, files_of_call, files_of_shell


def _fa(read: tuple[str, ...] = (), modified: tuple[str, ...] = ()) -> FileAccess:
    return FileAccess(read=read, modified=modified)


# --- FileAccess -------------------------------------------------------------------------------


def test_file_access_is_frozen_and_compares_by_value() -> None:
    access = FileAccess(read=("a.py",), modified=())
    assert access == _fa(read=("a.py",))
    with pytest.raises(AttributeError):
        access.read = ()  # type: ignore[misc]


# --- files_of_call: editor-style tools --------------------------------------------------------


@pytest.mark.parametrize("command", ["create", "str_replace", "insert", "undo_edit"])
def test_files_of_call_str_replace_editor_modifying_commands_mark_path_modified(command: str) -> None:
    args: dict[str, JsonValue] = {"command": command, "path": "/testbed/src/app.py", "file_text": "x"}
    assert files_of_call("str_replace_editor", args) == _fa(modified=("/testbed/src/app.py",))


def test_files_of_call_str_replace_editor_view_marks_path_read() -> None:
    assert files_of_call("str_replace_editor", {"command": "view", "path": "/x"}) == _fa(read=("/x",))


def test_files_of_call_str_replace_editor_command_is_not_parsed_as_shell() -> None:
    args: dict[str, JsonValue] = {"command": "view", "path": "/testbed/setup.py", "view_range": [1, 20]}
    assert files_of_call("str_replace_editor", args) == _fa(read=("/testbed/setup.py",))


@pytest.mark.parametrize(
    "name",
    [
        "create",
        "write",
        "write_file",
        "edit",
        "edit_file",
        "str_replace",
        "insert",
        "append",
        "patch",
        "apply_patch",
        "replace",
        "delete",
        "remove",
    ],
)
def test_files_of_call_modifying_tool_names_mark_path_modified(name: str) -> None:
    assert files_of_call(name, {"path": "src/a.py", "content": "print(1)"}) == _fa(modified=("src/a.py",))


@pytest.mark.parametrize(
    "name", ["view", "read", "read_file", "open", "cat", "show", "get_file", "search_file"]
)
def test_files_of_call_reading_tool_names_mark_path_read(name: str) -> None:
    assert files_of_call(name, {"path": "docs/guide.md"}) == _fa(read=("docs/guide.md",))


@pytest.mark.parametrize("key", ["path", "file", "filename", "file_path", "filepath", "target_file"])
def test_files_of_call_accepts_every_path_key(key: str) -> None:
    assert files_of_call("write_file", {key: "out/report.txt"}) == _fa(modified=("out/report.txt",))


@pytest.mark.parametrize("key", ["command", "action", "mode", "op"])
def test_files_of_call_sub_command_keys_decide_the_operation(key: str) -> None:
    assert files_of_call("file_tool", {key: "write", "path": "a.txt"}) == _fa(modified=("a.txt",))
    assert files_of_call("file_tool", {key: "read", "path": "a.txt"}) == _fa(read=("a.txt",))


def test_files_of_call_sub_command_overrides_tool_name() -> None:
    assert files_of_call("edit_file", {"action": "view", "path": "a.py"}) == _fa(read=("a.py",))


def test_files_of_call_unknown_sub_command_falls_back_to_tool_name() -> None:
    assert files_of_call("write_file", {"mode": "w", "path": "a.py"}) == _fa(modified=("a.py",))


@pytest.mark.parametrize("name", ["move", "rename"])
@pytest.mark.parametrize("dest_key", ["new_path", "destination", "dest"])
def test_files_of_call_move_marks_source_and_destination_modified(name: str, dest_key: str) -> None:
    args: dict[str, JsonValue] = {"path": "old/a.py", dest_key: "new/a.py"}
    assert files_of_call(name, args) == _fa(modified=("old/a.py", "new/a.py"))


def test_files_of_call_destination_ignored_for_non_move_tools() -> None:
    args: dict[str, JsonValue] = {"path": "a.py", "new_path": "b.py"}
    assert files_of_call("write_file", args) == _fa(modified=("a.py",))


def test_files_of_call_swe_agent_edit_without_path_returns_empty() -> None:
    args: dict[str, JsonValue] = {"start_line": 10, "end_line": 12, "replacement": "return x\n"}
    assert files_of_call("edit", args) == FileAccess((), ())


def test_files_of_call_apply_patch_without_path_invents_nothing() -> None:
    patch = "*** Begin Patch\n*** Update File: src/a.py\n@@\n-x\n+y\n*** End Patch"
    assert files_of_call("apply_patch", {"input": patch}) == _fa()


def test_files_of_call_keeps_paths_verbatim_and_deduplicated() -> None:
    args: dict[str, JsonValue] = {"path": "./src/../a.py", "file": "./src/../a.py"}
    assert files_of_call("read_file", args) == _fa(read=("./src/../a.py",))


def test_files_of_call_ignores_non_string_and_empty_path_values() -> None:
    assert files_of_call("read_file", {"path": 3}) == _fa()
    assert files_of_call("read_file", {"path": ""}) == _fa()
    assert files_of_call("read_file", {"path": {"nested": "a.py"}}) == _fa()


def test_files_of_call_path_with_unknown_tool_returns_empty() -> None:
    assert files_of_call("search", {"path": "src/", "query": "foo"}) == _fa()


def test_files_of_call_tool_name_is_case_insensitive_and_namespaced() -> None:
    assert files_of_call("Read_File", {"path": "a.md"}) == _fa(read=("a.md",))
    assert files_of_call("mcp__filesystem__write_file", {"path": "a.md"}) == _fa(modified=("a.md",))


# --- files_of_call: shell tools ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["bash", "shell", "sh", "run", "run_command", "execute", "exec", "terminal"])
def test_files_of_call_shell_tools_parse_command(name: str) -> None:
    args: dict[str, JsonValue] = {"command": "cat a.py > b.py"}
    assert files_of_call(name, args) == _fa(read=("a.py",), modified=("b.py",))


def test_files_of_call_cmd_key_is_shell_for_any_tool() -> None:
    assert files_of_call("container_tool", {"cmd": "touch new.txt"}) == _fa(modified=("new.txt",))


def test_files_of_call_script_key_is_shell() -> None:
    assert files_of_call("job", {"script": "rm -f old.log"}) == _fa(modified=("old.log",))


def test_files_of_call_command_key_of_unknown_tool_is_not_shell() -> None:
    assert files_of_call("deploy", {"command": "rm -f old.log"}) == _fa()


def test_files_of_call_shell_command_as_argv_list_is_parsed() -> None:
    args: dict[str, JsonValue] = {"command": ["bash", "-lc", "sed -i 's/a/b/' x.py"]}
    assert files_of_call("shell", args) == _fa(modified=("x.py",))
    assert files_of_call("shell", {"command": ["cat", "README.md"]}) == _fa(read=("README.md",))


def test_files_of_call_shell_tool_without_command_returns_empty() -> None:
    assert files_of_call("bash", {"timeout": 30}) == _fa()


def test_files_of_call_unknown_tool_returns_empty() -> None:
    assert files_of_call("web_search", {"query": "setup.py best practices"}) == _fa()


# --- files_of_shell: modifications ------------------------------------------------------------


def test_files_of_shell_sed_in_place_marks_files_modified() -> None:
    line = "cd /testbed && sed -i 's/foo/bar/' src/marshmallow/fields.py && python reproduce.py"
    assert files_of_shell(line) == _fa(read=("reproduce.py",), modified=("src/marshmallow/fields.py",))


@pytest.mark.parametrize(
    "line",
    [
        "sed -i.bak 's/a/b/' a.py b.py",
        "sed -i '' 's/a/b/' a.py b.py",
        "sed -i -e 's/a/b/' -e 's/c/d/' a.py b.py",
        "sed -e 's/a/b/' -i a.py b.py",
        "sed --in-place=.orig 's/a/b/' a.py b.py",
        "sed -ni 's/a/b/p' a.py b.py",
        "sed -Ei 's/(a)/b/' a.py b.py",
    ],
)
def test_files_of_shell_sed_in_place_forms_mark_all_files_modified(line: str) -> None:
    assert files_of_shell(line) == _fa(modified=("a.py", "b.py"))


def test_files_of_shell_heredoc_redirect_marks_target_modified_and_skips_body() -> None:
    line = "cat <<'EOF' > /testbed/reproduce.py\nimport os\nprint(open('x.txt').read())\nEOF"
    assert files_of_shell(line) == _fa(modified=("/testbed/reproduce.py",))


def test_files_of_shell_commands_after_a_heredoc_are_parsed() -> None:
    line = "cat > a.py << EOF\nx = 1\nEOF\npython a.py && rm -f a.py"
    assert files_of_shell(line) == _fa(read=("a.py",), modified=("a.py",))


def test_files_of_shell_append_redirect_ignores_dev_null() -> None:
    assert files_of_shell("echo hi >> notes.md 2>/dev/null") == _fa(modified=("notes.md",))


@pytest.mark.parametrize(
    "line",
    ["echo x > /dev/null", "cmd 2>/dev/null", "echo x >/dev/stderr", "echo x 1>&2", "cmd 2>&1"],
)
def test_files_of_shell_redirects_to_devices_or_descriptors_are_ignored(line: str) -> None:
    assert files_of_shell(line) == _fa()


def test_files_of_shell_redirect_forms_mark_targets_modified() -> None:
    line = "echo a>one.txt; echo b 1> two.txt; make 2> build.err; run &> all.log"
    assert files_of_shell(line) == _fa(modified=("one.txt", "two.txt", "build.err", "all.log"))


def test_files_of_shell_redirect_target_needs_no_extension() -> None:
    assert files_of_shell("printf 'x' > Makefile") == _fa(modified=("Makefile",))


def test_files_of_shell_input_redirect_marks_source_read() -> None:
    assert files_of_shell("python3 run.py < input.txt") == _fa(read=("run.py", "input.txt"))


def test_files_of_shell_tee_marks_files_modified() -> None:
    line = "python build.py | tee -a logs/build.log out.txt"
    assert files_of_shell(line) == _fa(read=("build.py",), modified=("logs/build.log", "out.txt"))


def test_files_of_shell_touch_and_rm_mark_files_modified() -> None:
    line = "touch src/__init__.py && rm -rf build/ dist/pkg.whl"
    assert files_of_shell(line) == _fa(modified=("src/__init__.py", "build/", "dist/pkg.whl"))


def test_files_of_shell_mv_marks_source_and_destination_modified() -> None:
    assert files_of_shell("mv -f old/a.py new/a.py") == _fa(modified=("old/a.py", "new/a.py"))


def test_files_of_shell_cp_marks_source_read_and_destination_modified() -> None:
    assert files_of_shell("cp -r a.py b.py dest/") == _fa(read=("a.py", "b.py"), modified=("dest/",))


def test_files_of_shell_cp_target_directory_option_is_the_destination() -> None:
    assert files_of_shell("cp -t dest/ a.py b.py") == _fa(read=("a.py", "b.py"), modified=("dest/",))


def test_files_of_shell_mkdir_is_not_a_modification() -> None:
    assert files_of_shell("mkdir -p src/pkg/sub") == _fa()


def test_files_of_shell_patch_reads_patch_file_and_invents_no_modification() -> None:
    assert files_of_shell("patch -p1 < fix.patch") == _fa(read=("fix.patch",))
    assert files_of_shell("patch -p1 -i fix.diff") == _fa(read=("fix.diff",))
    assert files_of_shell("git apply --check changes.diff") == _fa(read=("changes.diff",))


def test_files_of_shell_python_inline_open_write_marks_modified() -> None:
    assert files_of_shell("""python -c "open('out.txt','w').write('x')" """) == _fa(modified=("out.txt",))


@pytest.mark.parametrize("mode", ["w", "a", "x", "wb", "ab"])
def test_files_of_shell_python_inline_open_write_modes_mark_modified(mode: str) -> None:
    assert files_of_shell(f'python3 -c \'open("data.json", "{mode}")\'') == _fa(modified=("data.json",))


def test_files_of_shell_python_inline_open_read_marks_read() -> None:
    line = """python -c "print(open('a.txt').read(), open('b.txt', 'r'), open('c.bin', mode='rb'))" """
    assert files_of_shell(line) == _fa(read=("a.txt", "b.txt", "c.bin"))


def test_files_of_shell_python_open_read_plus_is_read_and_modified() -> None:
    line = """python -c "open('db.txt', 'r+')" """
    assert files_of_shell(line) == _fa(read=("db.txt",), modified=("db.txt",))


def test_files_of_shell_python_open_ignores_urlopen_and_variables() -> None:
    line = """python -c "import urllib.request as u; u.urlopen('http://x/a.json'); open(name, 'w')" """
    assert files_of_shell(line) == _fa()


def test_files_of_shell_python_heredoc_open_marks_files() -> None:
    line = "python3 - <<'PY'\nwith open('in.csv') as f:\n    open('out.csv', 'w').write(f.read())\nPY"
    assert files_of_shell(line) == _fa(read=("in.csv",), modified=("out.csv",))


def test_files_of_shell_heredoc_not_fed_to_python_is_not_scanned_for_open() -> None:
    line = "cat > gen.py <<EOF\nopen('out.txt', 'w')\nEOF"
    assert files_of_shell(line) == _fa(modified=("gen.py",))


def test_files_of_shell_keeps_first_seen_order_across_heredocs() -> None:
    line = "python3 <<EOF\nopen('first.txt', 'w')\nEOF\necho x > second.txt"
    assert files_of_shell(line) == _fa(modified=("first.txt", "second.txt"))


def test_files_of_shell_echo_redirect_marks_modified() -> None:
    assert files_of_shell("echo 'FOO=1' > .env") == _fa(modified=(".env",))


# --- files_of_shell: reads --------------------------------------------------------------------


def test_files_of_shell_grep_reads_files_after_pattern_not_the_pattern() -> None:
    line = 'grep -n "def _serialize" src/marshmallow/fields.py | head -20'
    assert files_of_shell(line) == _fa(read=("src/marshmallow/fields.py",))


def test_files_of_shell_grep_with_path_like_pattern_skips_the_pattern() -> None:
    assert files_of_shell("grep -rn 'a/b.py' src/ setup.py") == _fa(read=("src/", "setup.py"))


def test_files_of_shell_grep_options_with_values_are_skipped() -> None:
    line = "grep -A 3 -B2 --include '*.py' -e foo.bar tests/test_x.py"
    assert files_of_shell(line) == _fa(read=("tests/test_x.py",))


def test_files_of_shell_rg_type_option_value_is_not_the_pattern() -> None:
    assert files_of_shell("rg -t py TODO src/app.py") == _fa(read=("src/app.py",))


def test_files_of_shell_find_xargs_grep_with_glob_yields_nothing() -> None:
    assert files_of_shell('find . -name "*.py" | xargs grep foo') == _fa()


@pytest.mark.parametrize("reader", ["cat", "head", "tail", "less", "more", "nl", "wc"])
def test_files_of_shell_reader_commands_mark_files_read(reader: str) -> None:
    assert files_of_shell(f"{reader} src/a.py README.md") == _fa(read=("src/a.py", "README.md"))


def test_files_of_shell_reader_option_values_are_not_paths() -> None:
    line = "head -n 5 a.py; tail -n +10 b.log; cat -n c.py; nl -ba d.py; wc -l e.py"
    assert files_of_shell(line) == _fa(read=("a.py", "b.log", "c.py", "d.py", "e.py"))


def test_files_of_shell_sed_without_in_place_marks_files_read() -> None:
    assert files_of_shell("sed -n '10,40p' src/app.py") == _fa(read=("src/app.py",))
    assert files_of_shell("sed -n -e '1p' -e '$p' setup.cfg") == _fa(read=("setup.cfg",))


def test_files_of_shell_awk_with_file_marks_read() -> None:
    line = "awk -F: '{print $1}' /etc/passwd data.csv"
    assert files_of_shell(line) == _fa(read=("/etc/passwd", "data.csv"))
    assert files_of_shell("awk '{print}'") == _fa()


@pytest.mark.parametrize("python", ["python", "python3", "python3.11", "/usr/bin/python3"])
def test_files_of_shell_python_script_is_read(python: str) -> None:
    assert files_of_shell(f"{python} -u reproduce.py --out result.json") == _fa(read=("reproduce.py",))


def test_files_of_shell_python_module_and_pytest_are_not_counted() -> None:
    assert files_of_shell("python -m pytest tests/test_x.py -q") == _fa()
    assert files_of_shell("pytest tests/unit/test_a.py tests/") == _fa()


def test_files_of_shell_ls_and_cd_are_not_counted() -> None:
    assert files_of_shell("cd /testbed && ls -la src/ setup.py") == _fa()


# --- files_of_shell: tokens, splitting, robustness --------------------------------------------


@pytest.mark.parametrize(
    "token",
    ["-v", "$(pwd)/a.py", "`pwd`/a.py", "src/*.py", "a?.py", "[ab].py", "https://x.org/a.py", "5", "1.5"],
)
def test_files_of_shell_rejects_tokens_that_do_not_look_like_paths(token: str) -> None:
    assert files_of_shell(f"cat {token!r}") == _fa()


@pytest.mark.parametrize("token", ["setup.py", "README.md", "src/pkg", "/etc/hosts", ".bashrc", "a.tar.gz"])
def test_files_of_shell_accepts_tokens_that_look_like_paths(token: str) -> None:
    assert files_of_shell(f"cat {token}") == _fa(read=(token,))


def test_files_of_shell_plain_word_without_extension_is_not_a_path() -> None:
    assert files_of_shell("cat Makefile") == _fa()


def test_files_of_shell_strips_quotes_and_keeps_paths_verbatim() -> None:
    line = """cat "./src/../my file.py" '~/notes.txt'"""
    assert files_of_shell(line) == _fa(read=("./src/../my file.py", "~/notes.txt"))


def test_files_of_shell_splits_on_every_separator() -> None:
    line = "cat a.py && cat b.py || cat c.py; cat d.py | cat e.py\ncat f.py"
    assert files_of_shell(line) == _fa(read=("a.py", "b.py", "c.py", "d.py", "e.py", "f.py"))


def test_files_of_shell_quoted_separators_do_not_split() -> None:
    assert files_of_shell("grep 'a|b && c' src/x.py") == _fa(read=("src/x.py",))


def test_files_of_shell_line_continuation_joins_lines() -> None:
    assert files_of_shell("sed -i 's/a/b/' \\\n  src/a.py") == _fa(modified=("src/a.py",))


def test_files_of_shell_same_path_read_and_modified_appears_in_both() -> None:
    line = "cat config.yml > /tmp/backup.yml && sed -i 's/a/b/' config.yml"
    assert files_of_shell(line) == _fa(read=("config.yml",), modified=("/tmp/backup.yml", "config.yml"))


def test_files_of_shell_deduplicates_in_first_seen_order() -> None:
    line = "cat b.py a.py && head b.py && echo > z.txt && echo >> y.txt && echo >> z.txt"
    assert files_of_shell(line) == _fa(read=("b.py", "a.py"), modified=("z.txt", "y.txt"))


def test_files_of_shell_env_assignments_and_wrappers_are_skipped() -> None:
    line = "PYTHONPATH=src sudo -E timeout -s KILL 30 sed -i 's/x/y/' app.py"
    assert files_of_shell(line) == _fa(modified=("app.py",))


def test_files_of_shell_nested_bash_c_is_parsed() -> None:
    assert files_of_shell("bash -c 'cat in.txt > out.txt'") == _fa(read=("in.txt",), modified=("out.txt",))


def test_files_of_shell_unbalanced_quotes_fall_back_to_simple_split() -> None:
    assert files_of_shell("echo 'oops > broken.txt") == _fa(modified=("broken.txt",))
    assert files_of_shell('cat "src/a.py') == _fa(read=("src/a.py",))


@pytest.mark.parametrize(
    "line",
    ["", "   ", "\n\n", "&&", "|| ;", ">", "<<", "cat <<EOF", "sed -i", "cp", "python -c", "timeout", "'"],
)
def test_files_of_shell_degenerate_input_returns_empty_without_raising(line: str) -> None:
    assert files_of_shell(line) == _fa()


def test_files_of_shell_is_deterministic() -> None:
    line = "cp a.py b.py && sed -i 's/x/y/' b.py c.py | tee log.txt"
    assert (
        files_of_shell(line)
        == files_of_shell(line)
        == _fa(read=("a.py",), modified=("b.py", "c.py", "log.txt"))
    )


def test_files_of_shell_sed_glued_script_containing_i_is_not_in_place() -> None:
    assert files_of_shell("sed -es/x/i/ a.py") == _fa(read=("a.py",))
    assert files_of_shell("sed -ie 's/x/y/' a.py") == _fa(modified=("a.py",))


def test_files_of_shell_wrapper_option_values_are_not_the_command() -> None:
    line = "sudo -u app sed -i 's/x/y/' conf.ini && nice -n 10 cat a.log && xargs -I {} rm b.txt"
    assert files_of_shell(line) == _fa(read=("a.log",), modified=("conf.ini", "b.txt"))
