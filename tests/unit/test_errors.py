"""Errors: one tree, stable unique codes, a lossless wire form."""

from __future__ import annotations

import importlib
from pathlib import Path

import contracts.exceptions as errors_module
from contracts import ErrorCode, ErrorReply
from contracts.exceptions import (
    CtxError,
    ForeignSession,
    NotYetRecorded,
    RevisionConflict,
    ScopeViolation,
    StoreUnavailable,
    error_from_reply,
)


ROOT = Path(__file__).resolve().parents[2]


def _all_error_classes() -> list[type[CtxError]]:
    # Every module that could define one, imported: a subclass exists only once its module is loaded.
    for path in sorted([*(ROOT / "services").rglob("*.py"), *(ROOT / "ctxfleet_client").rglob("*.py")]):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        importlib.import_module(module)
    out: list[type[CtxError]] = []
    todo = [CtxError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def test_errors_every_class_lives_in_one_tree_with_a_distinct_code_that_exists_on_the_wire() -> None:
    classes = [c for c in _all_error_classes() if c is not CtxError]
    elsewhere = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in classes if c.__module__ != errors_module.__name__
    )
    assert elsewhere == [], "typed errors live in contracts/exceptions.py"
    # A refinement that keeps its parent's code (ForeignSession is a ScopeViolation) defines none of its own.
    codes = [c.code for c in classes if "code" in vars(c)]
    assert len(codes) == len(set(codes)), "two error classes share a code"
    assert all(isinstance(code, ErrorCode) for code in codes)


def test_errors_retryable_only_for_transient_failures() -> None:
    retryable = {c.__name__ for c in _all_error_classes() if c.retryable}
    assert retryable == {
        "RevisionConflict",
        "StoreUnavailable",
        "NotYetRecorded",
        "PositionRegressed",
        "FleetUnavailable",
        "Overloaded",
    }


def test_error_from_reply_rebuilds_the_typed_error_with_its_details() -> None:
    original = NotYetRecorded("r.main", "k9", 1200)
    rebuilt = error_from_reply(ErrorReply.model_validate_json(original.to_reply().model_dump_json()))
    assert type(rebuilt) is NotYetRecorded
    assert (rebuilt.message, rebuilt.details, rebuilt.retryable) == (original.message, original.details, True)


def test_error_from_reply_of_an_unknown_code_is_a_plain_ctx_error() -> None:
    rebuilt = error_from_reply(ErrorReply(code=ErrorCode.INTERNAL, message="boom"))
    assert type(rebuilt) is CtxError and rebuilt.message == "boom"


def test_scope_violation_keeps_the_owner_out_of_its_wire_form() -> None:
    err = ScopeViolation("r.main", "s-claimed", "s-owner")
    assert "s-owner" not in err.to_reply().model_dump_json()
    assert err.owner_session_id == "s-owner"


def test_a_foreign_session_is_a_scope_violation_that_names_no_tenant() -> None:
    err = ForeignSession("s-1")
    assert isinstance(err, ScopeViolation) and err.code is ErrorCode.SCOPE_VIOLATION
    assert err.details == {"session_id": "s-1"} and "another tenant" in err.message


def test_revision_conflict_and_store_unavailable_carry_typed_fields() -> None:
    assert RevisionConflict("r.main", 3, 4).details == {"thread_id": "r.main", "expected": 3, "actual": 4}
    assert StoreUnavailable("reset").details == {"cause": "reset"}
