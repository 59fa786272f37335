"""docs/configuration.md's settings table is the one ``infra.settings_doc`` writes from ``Settings``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field

from infra import settings_doc
from infra.settings_doc import BEGIN, DOC, END, groups_of, render_table, rewrite, table_of
from services.settings import GROUPS, TuningSettings


def test_settings_doc_committed_table_is_what_the_generator_writes() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert rewrite(text, render_table()) == text, (
        "docs/configuration.md's settings table is stale: run `python -m infra.settings_doc`"
    )


def test_settings_doc_has_a_table_per_group_with_one_row_per_setting_in_model_order() -> None:
    assert [name for name, _ in groups_of()] == list(GROUPS)
    for name, group in groups_of():
        assert f"### `{name}` — " in render_table()
        variables = [row[0].split(",")[0].strip("`") for row in table_of(group)]
        assert variables == [f"CTX_{field.upper()}" for field in group.model_fields]


def test_settings_doc_shows_defaults_bounds_and_the_file_form_of_secrets() -> None:
    rows = {row[0]: row for _, group in groups_of() for row in table_of(group)}
    assert rows["`CTX_PARTITIONS`"][1:3] == ("`16`", "integer ≥ 1, ≤ 1024")
    assert rows["`CTX_NATS_SYNC_ALWAYS`"][1] == "`true`"
    assert rows["`CTX_SUMMARIZER`"][2] == "`structured` / `openai`"
    assert rows["`CTX_DATA_DIR`"][1] == "`<checkout>/.ctxfleet`"
    assert "`CTX_NATS_PASSWORD`, `CTX_NATS_PASSWORD_FILE`" in rows


def test_settings_doc_refuses_a_setting_without_a_meaning() -> None:
    class WithNewKnob(TuningSettings):
        new_knob: Annotated[int, Field(ge=1)] = 3

    with pytest.raises(KeyError, match="new_knob"):
        table_of(WithNewKnob)


def test_settings_doc_check_fails_when_the_committed_table_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# c\n\n{BEGIN}\n| old |\n{END}\n", encoding="utf-8")
    monkeypatch.setattr(settings_doc, "DOC", doc)
    assert settings_doc.main(["--check"]) == 1
    assert settings_doc.main([]) == 0
    assert settings_doc.main(["--check"]) == 0
    assert render_table() in doc.read_text(encoding="utf-8")
