"""A long coding-agent thread generated in code: the same steps every time, no randomness.

The agent reads modules, edits them, greps, and runs the tests, which fail in rotation and pass
once fixed: long enough (1,000 steps) to show whether a summary stays within its share of the
budget however long the thread grows.
"""

from __future__ import annotations

from services.core.trace import TraceCall, TraceLine

__all__ = ["SYNTHETIC_TASK", "synthetic_trace"]

SYNTHETIC_TASK = (
    "Fix the failing tests in the billing package. You must not change the public API of billing/api.py, "
    "and never edit files under tests/. Only touch modules under billing/."
)
_MODULES = 120


def synthetic_trace(steps: int = 1000) -> list[TraceLine]:
    """A system prompt, the task, then ``steps`` tool calls with their outcomes."""
    lines = [
        TraceLine(
            line=1,
            kind="system",
            text="You are a coding agent working in a Python repository. Use the bash tool.",
        ),
        TraceLine(line=2, kind="user_input", text=SYNTHETIC_TASK),
    ]
    for step in range(steps):
        # The agent moves on to another module every 8 steps and comes back to it 120 modules later.
        module = f"billing/mod_{(step // 8) % _MODULES:03d}.py"
        command, output, status = _action(step, module)
        call = TraceCall(call_id=f"call_{step:05d}", name="bash", args={"command": command})
        thought = f"Step {step}: next I run `{command.split(chr(10))[0]}` to make progress on {module}."
        lines.append(
            TraceLine(line=len(lines) + 1, kind="assistant_message", text=thought, tool_calls=(call,))
        )
        lines.append(
            TraceLine(
                line=len(lines) + 1, kind="tool_outcome", text=output, call_id=call.call_id, status=status
            )
        )
    lines.append(TraceLine(line=len(lines) + 1, kind="assistant_message", text="All tests pass; done."))
    return lines


def _action(step: int, module: str) -> tuple[str, str, str]:
    n = (step // 8) % _MODULES
    match step % 4:
        case 0:
            body = "\n".join(
                f"def charge_{n}_{i}(amount):\n    return round(amount * {1 + i / 100:.2f}, 2)"
                for i in range(12)
            )
            return f"cat {module}", f"<returncode>0</returncode>\n<output>\n{body}\n</output>", "success"
        case 1:
            return (
                f"sed -i 's/round(amount/round(float(amount)/' {module}",
                "<returncode>0</returncode>\n<output>\n</output>",
                "success",
            )
        case 2:
            return (
                f"grep -n 'def charge_{n}' {module}",
                f"{module}:{step % 40 + 1}:def charge_{n}_0(amount):",
                "success",
            )
        case _:
            test = f"tests/test_mod_{n:03d}.py"
            if step % 8 == 7:  # the module's second test run passes: its failure is cleared
                return f"python -m pytest {test} -q", f"12 passed in 0.{step % 90 + 10}s", "success"
            trace = "\n".join(
                f"{test}:{10 + i}: in test_charge_{i}\n    assert charge_{n}_{i}(10) == {10 + i}"
                for i in range(6)
            )
            failure = (
                f"FAILED {test}::test_charge_{step % 7} - AssertionError: assert {step % 50}.5 == {step % 50}"
            )
            return f"python -m pytest {test} -q", f"F.....\n{trace}\n{failure}\n1 failed, 11 passed", "error"
