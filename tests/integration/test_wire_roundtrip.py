"""The Node.js round trip: a runtime in another language with only the generated schemas (tests/node)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from infra.embedded import free_port
from infra.schemas import write_schemas
from services.settings import Settings
from tests.fixtures.node import installed_node_packages

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
# Small enough that the oversize input stays far below NATS's own 1 MiB payload limit.
MAX_EVENT_BYTES = 65_536


@pytest.fixture(scope="session")
def node_packages() -> Path:
    """tests/node with its locked packages installed (npm ci; the registry is reachable at install time)."""
    return installed_node_packages(NODE_DIR)


async def test_a_node_runtime_publishes_prepares_and_validates_every_reply_with_the_generated_schemas(
    node_packages: Path, start_fleet, streams: str, tmp_path: Path
) -> None:
    await start_fleet(max_event_bytes=MAX_EVENT_BYTES)
    schemas = tmp_path / "schemas"
    write_schemas(schemas, Settings(nats_url=streams))
    # CTX_NATS_URL as it names a cluster, one node of it down: the runtime connects to the live one.
    cluster = f"{streams},nats://127.0.0.1:{free_port()}"
    node = await asyncio.create_subprocess_exec(
        "node",
        str(node_packages / "roundtrip.mjs"),
        str(schemas),
        cwd=node_packages,
        env={**os.environ, "CTX_NATS_URL": cluster, "ROUNDTRIP_MAX_EVENT_BYTES": str(MAX_EVENT_BYTES)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), timeout=50)
    assert node.returncode == 0, f"{out.decode()}\n{err.decode()}"
    report = json.loads(out.decode().strip().splitlines()[-1])
    checked = report["checked"]
    assert checked["asyncapi_diagnostics"] == 0
    # The schema files discriminate events on their kind: a missing one is one error, not twelve.
    assert checked["missing_kind_errors"] == 1
    # The client model from the AsyncAPI document covers every reply, the errors included.
    assert {"Event", "PrepareRequest", "PreparedContext", "ErrorReply", "ReadReply", "Receipt"} <= set(
        checked["document_validators"]
    )
    # It served a context hook: each call and answer checked against HookCall / HookReply, the
    # hook's addition in the context, every action prepare of the session calling it once.
    assert {"HookCall", "HookReply"} <= set(checked["document_validators"])
    assert checked["hooks_register"] == "HooksRegistered"
    assert checked["hook_touches"] == ["node-policy@1:patched"]
    assert checked["hook_calls"] >= 2
    assert {what: v["rejected_code"] for what, v in checked["bad_inputs"].items()} == {
        "missing field": "invalid_event",
        "unknown kind": "unknown_event_kind",
        "malformed JSON": "malformed_json",
        "invalid UTF-8": "invalid_encoding",
        "duplicate keys": "invalid_event",
        "wrong thread": "thread_mismatch",
        "oversize": "payload_too_large",
    }
    # Operator requests too: the test fleet's NATS has no accounts, so nothing is refused.
    assert checked["requests"] == {
        "read": "ReadReply",
        "search": "SearchReply",
        "operation_status": "not_found",
        "inspect": "ThreadInspection",
        "session_inspect": "SessionInspection",
        "policy_register": "PolicyRegistered",
        "tools_register": "CatalogRegistered",
    }
    assert checked["dead_letters"] == sorted(
        [
            "invalid_event",
            "unknown_event_kind",
            "malformed_json",
            "invalid_encoding",
            "invalid_event",
            "thread_mismatch",
            "payload_too_large",
        ]
    )
