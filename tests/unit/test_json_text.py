"""Event content's compact JSON text: the json module's text, the same numbers, written by orjson."""

from __future__ import annotations

import enum
import json
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import JsonValue

from services.core.json_text import compact
from services.core.render import arguments_json

_no_floats = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)
_finite_floats = st.floats(allow_nan=False, allow_infinity=False)
_with_floats = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63) | _finite_floats | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


def _stdlib(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(_no_floats)
def test_text_without_floats_is_the_json_modules_byte_for_byte(value: Any) -> None:
    assert compact(value) == _stdlib(value)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(_with_floats)
def test_every_number_reads_back_as_the_same_value(value: Any) -> None:
    assert json.loads(compact(value)) == json.loads(_stdlib(value))


def test_keys_stay_in_the_order_they_were_written() -> None:
    args: dict[str, JsonValue] = {"z": 1, "a": {"y": "é", "b": None}, "m": ["\u2028\x00\x7f😀"]}
    assert arguments_json(args) == '{"z":1,"a":{"y":"é","b":null},"m":["\u2028\\u0000\x7f😀"]}'
    assert arguments_json(args) == _stdlib(args)


class _Color(str, enum.Enum):
    RED = "red"


@pytest.mark.parametrize(
    "value",
    [{"big": 2**64 + 1}, {"color": _Color.RED}, {1: "an int key"}, [2**63, -(2**63)], {"s": "\ud800 lone"}],
)
def test_what_orjson_refuses_is_written_as_json_writes_it(value: Any) -> None:
    assert compact(value) == _stdlib(value)


def test_a_value_json_cannot_write_fails_as_it_always_did() -> None:
    # orjson would write a datetime; json refuses it, and so does this.
    with pytest.raises(TypeError):
        compact({"at": datetime(2026, 12, 3, tzinfo=timezone.utc)})  # type: ignore[dict-item]
