"""`make schemas`: a JSON Schema per message and the AsyncAPI document."""

from __future__ import annotations

import json
from pathlib import Path

from infra.schemas import write_schemas


def test_write_schemas_writes_every_message_and_an_asyncapi_document(tmp_path: Path) -> None:
    names = {p.name for p in write_schemas(tmp_path)}
    assert names == {
        "Event.schema.json",
        "PrepareRequest.schema.json",
        "PreparedContext.schema.json",
        "ErrorReply.schema.json",
        "DeadLetter.schema.json",
        "InspectRequest.schema.json",
        "ThreadInspection.schema.json",
        "SearchRequest.schema.json",
        "SearchReply.schema.json",
        "ReadRequest.schema.json",
        "asyncapi.json",
    }
    event = json.loads((tmp_path / "Event.schema.json").read_text())
    kinds = set(event["discriminator"]["mapping"])
    assert kinds == {
        "system",
        "user_input",
        "assistant_message",
        "tool_outcome",
        "resource_activated",
        "child_result",
        "run_status",
        "context_export",
        "context_reset",
        "state_patch",
        "operation_reconcile",
    }
    asyncapi = json.loads((tmp_path / "asyncapi.json").read_text())
    addresses = {c["address"] for c in asyncapi["channels"].values()}
    assert {
        "ctx.prepare.{tenant}.{run_id}.{instance_id}",
        "ctx.inspect.{tenant}.{run_id}.{instance_id}",
        "ctx.search.{tenant}",
        "ctx.read.{tenant}",
    } <= addresses
