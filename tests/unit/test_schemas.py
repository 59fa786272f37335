"""`make schemas`: a draft 2020-12 JSON Schema per wire message and the AsyncAPI 3.0.0 document."""

from __future__ import annotations

import copy
import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any, get_args

import pytest
from jsonschema import Draft7Validator, Draft202012Validator
from pydantic import BaseModel, ValidationError

import contracts
from contracts import (
    EVENT_KINDS,
    ErrorCode,
    ErrorReply,
    ReadReply,
    reply_json,
    CompactionTriggers,
    ContextPolicy,
    EvidenceRef,
    PreparedContext,
    PrepareRequest,
    ReadRequest,
)
from contracts._base import WireModel
from contracts.task_budgets import TaskBudget
from contracts.wire_json import JSON_INT_MAX, JSON_INT_MIN
from contracts.hook_protocol import HookBlock, HookCall, HookReply
from contracts.hooks import HookPoint
from infra.asyncapi import CHANNELS, Channel, asyncapi_document
from infra.wire_schema import WireMessage
from infra.schemas import write_schemas
from services.settings import Settings
from tests.fixtures.builders import Thread
from workers.compose import create_docs_app

ROOT = Path(__file__).resolve().parents[2]
ASYNCAPI_3_0_0 = json.loads((ROOT / "tests" / "schemas" / "asyncapi-3.0.0.json").read_text())
GOLDEN = ROOT / "tests" / "golden" / "prepare"

MESSAGES = {
    "Event",
    "PrepareRequest",
    "PreparedContext",
    "ErrorReply",
    "DeadLetter",
    "InspectRequest",
    "ThreadInspection",
    "SessionInspection",
    "ContextRequest",
    "ContextShown",
    "SearchRequest",
    "SearchReply",
    "ReadRequest",
    "ReadReply",
    "ContextPolicy",
    "PolicyRegistered",
    "ToolCatalog",
    "CatalogRegistered",
    "HookSet",
    "HooksRegistered",
    "OperationStatusRequest",
    "Receipt",
    "RecordedNotice",
    "CompactedNotice",
    "CompactionJob",
    "ForkRequest",
    "SessionForked",
    "ExportRequest",
    "ExportPage",
    "CompactRequest",
    "CompactReply",
    "FinalCheckRequest",
    "FinalCheck",
    "HookCall",
    "HookReply",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("schemas")
    return {p.name: json.loads(p.read_text()) for p in write_schemas(out, Settings(nats_url=None))}


def _validator(written: dict[str, Any], name: str) -> Draft202012Validator:
    return Draft202012Validator(written[f"{name}.schema.json"])


def test_write_schemas_writes_a_schema_per_wire_message_and_the_asyncapi_document(
    written: dict[str, Any],
) -> None:
    assert set(written) == {f"{m}.schema.json" for m in MESSAGES} | {"asyncapi.json"}


def test_every_message_schema_is_draft_2020_12_with_a_unique_id(written: dict[str, Any]) -> None:
    ids = []
    for name, schema in written.items():
        if name == "asyncapi.json":
            continue
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        ids.append(schema["$id"])
    assert len(set(ids)) == len(MESSAGES)


def test_the_event_schema_discriminates_on_a_required_kind_and_no_other_schema_has_a_discriminator(
    written: dict[str, Any],
) -> None:
    # ajv's discriminator option takes {propertyName} alone (no mapping) and needs the tag required in
    # every branch; it then reports one error for a bad kind instead of one per branch.
    event = written["Event.schema.json"]
    assert event["discriminator"] == {"propertyName": "kind"} and "mapping" not in json.dumps(event)
    assert all("kind" in event["$defs"][r["$ref"].rsplit("/", 1)[1]]["required"] for r in event["oneOf"])
    others = {name for name, s in written.items() if '"discriminator"' in json.dumps(s)}
    assert others == {"Event.schema.json", "asyncapi.json"}
    # AsyncAPI 3.0.0's schema object names the property itself.
    assert written["asyncapi.json"]["components"]["schemas"]["Event"]["discriminator"] == "kind"


def test_a_missing_kind_is_refused_by_the_event_schema(written: dict[str, Any]) -> None:
    # A tool outcome's payload fits no other kind: only the required kind refuses it.
    body = json.loads(Thread().outcome("c1", "a").model_dump_json())
    assert _validator(written, "Event").is_valid(body)
    del body["kind"]
    assert not _validator(written, "Event").is_valid(body)


def test_the_event_schema_is_one_of_every_kind_pinned_by_const(written: dict[str, Any]) -> None:
    event = written["Event.schema.json"]
    defs = event["$defs"]
    kinds = [defs[ref["$ref"].rsplit("/", 1)[1]]["properties"]["kind"]["const"] for ref in event["oneOf"]]
    assert sorted(kinds) == sorted(EVENT_KINDS)


def test_events_as_the_python_client_sends_them_satisfy_the_event_schema(written: dict[str, Any]) -> None:
    t = Thread()
    validator = _validator(written, "Event")
    events = (
        t.system("be brief"),
        t.user("hi"),
        t.assistant("", calls=(("c1", "ls", {}),)),
        t.outcome("c1", "a"),
    )
    for event in events:
        assert list(validator.iter_errors(json.loads(event.model_dump_json()))) == []
    assert not validator.is_valid({**json.loads(t.user("hi").model_dump_json()), "kind": "telepathy"})


@pytest.mark.parametrize("case", sorted(p.stem for p in GOLDEN.glob("*.json")))
def test_golden_prepared_contexts_satisfy_the_prepared_context_schema(
    written: dict[str, Any], case: str
) -> None:
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    reply = json.loads(reply_json(PreparedContext.model_validate(golden["expected"])))
    assert list(_validator(written, "PreparedContext").iter_errors(reply)) == []
    assert list(_validator(written, "PrepareRequest").iter_errors(golden["request"])) == []


def _agrees(written: dict[str, Any], model: type[BaseModel], body: dict[str, Any]) -> tuple[bool, bool]:
    try:
        model.model_validate(body)
        python = True
    except ValidationError:
        python = False
    return _validator(written, model.__name__).is_valid(body), python


_PREPARE = {"session_id": "s1", "run_id": "r1", "instance_id": "main"}
_PROFILE = {"name": "p", "context_window": 8000}


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (PrepareRequest, _PREPARE),
        (PrepareRequest, {**_PREPARE, "model_profile": "gpt-4o"}),
        (PrepareRequest, {**_PREPARE, "profile": _PROFILE}),
        (PrepareRequest, {**_PREPARE, "budget_tokens": 900}),
        (PrepareRequest, {**_PREPARE, "model_profile": "gpt-4o", "budget_tokens": 900}),
        (PrepareRequest, {**_PREPARE, "profile": _PROFILE, "budget_tokens": 900}),
        (PrepareRequest, {**_PREPARE, "model_profile": "gpt-4o", "profile": _PROFILE}),
        (PrepareRequest, {**_PREPARE, "model_profile": None, "budget_tokens": None}),
        (PrepareRequest, {**_PREPARE, "model_profile": None, "profile": _PROFILE}),
        (ContextPolicy, {"name": "p"}),
        (ContextPolicy, {"name": "p", "profile": _PROFILE}),
        (ContextPolicy, {"name": "p", "model_profile": None, "profile": _PROFILE}),
        (ContextPolicy, {"name": "p", "model_profile": None}),
        (ContextPolicy, {"name": "p", "model_profile": None, "budget_tokens": 5000}),
        (ReadRequest, {"session_id": "s1", "ref": "ctx://record/r1.main/1"}),
        (ReadRequest, {"session_id": "s1", "ref": "ctx://record/r1.main/1", "line": 3}),
        (ReadRequest, {"session_id": "s1", "ref": "ctx://record/r1.main/1", "line": 3, "lines": 2}),
        (ReadRequest, {"session_id": "s1", "ref": "ctx://record/r1.main/1", "line": None, "lines": 2}),
        (CompactionTriggers, {}),
        (CompactionTriggers, {"context_ratio": None}),
        (CompactionTriggers, {"context_ratio": None, "user_turns": 3}),
        (EvidenceRef, {"thread_id": "r1.main", "seq": 2, "end_line": 4}),
        (EvidenceRef, {"thread_id": "r1.main", "seq": 2, "start_line": 1, "end_line": 4}),
        (TaskBudget, {}),
        (TaskBudget, {"hard": False}),
        (TaskBudget, {"model_calls": None, "cost": None}),
        (TaskBudget, {"model_calls": None, "cost": 1.5}),
        (TaskBudget, {"runtime_seconds": 600}),
    ],
)
def test_a_schema_accepts_exactly_what_its_model_validator_accepts(
    written: dict[str, Any], model: type[BaseModel], body: dict[str, Any]
) -> None:
    if model.__name__ == "CompactionTriggers":  # a part of ContextPolicy, not a message of its own
        body = {"name": "p", "compaction": {"triggers": body}}
        model = ContextPolicy
    if model.__name__ == "EvidenceRef":
        body = {**_PREPARE, "budget_tokens": 900, "evidence": [body]}
        model = PrepareRequest
    if model.__name__ == "TaskBudget":
        body = {**_PREPARE, "budget_tokens": 900, "task_budget": body}
        model = PrepareRequest
    schema_says, python_says = _agrees(written, model, body)
    assert schema_says == python_says


def _integers(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, list):
        return [i for v in node for i in _integers(v)]
    if not isinstance(node, dict):
        return []
    own = [node] if node.get("type") == "integer" else []
    return own + [i for v in node.values() for i in _integers(v)]


def test_every_integer_of_every_schema_is_bounded_within_signed_64_bit(written: dict[str, Any]) -> None:
    # What the fleet reads (contracts.wire_json): a runtime's validator refuses 2**63 where the fleet does.
    found = [i for schema in written.values() for i in _integers(schema)]
    assert found
    for i in found:
        assert i.get("minimum", i.get("exclusiveMinimum")) >= JSON_INT_MIN
        assert i.get("maximum", i.get("exclusiveMaximum")) <= JSON_INT_MAX


def test_chat_messages_are_typed_without_null_since_none_is_omitted(written: dict[str, Any]) -> None:
    chat = written["PreparedContext.schema.json"]["$defs"]["ChatMessage"]["properties"]
    assert "null" not in json.dumps(chat)


SENT = ("PreparedContext", "ThreadInspection", "SessionInspection", "ReadReply", "SearchReply", "Receipt")
SENT += ("PolicyRegistered", "CatalogRegistered", "ErrorReply", "DeadLetter", "RecordedNotice")


@pytest.mark.parametrize("name", SENT)
def test_what_the_fleet_sends_is_typed_without_null(written: dict[str, Any], name: str) -> None:
    text = json.dumps(written[f"{name}.schema.json"])
    assert '{"type": "null"}' not in text and '"default": null' not in text


def _models_under(model: type[BaseModel]) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    todo = [model]
    while todo:
        m = todo.pop()
        if m in found:
            continue
        found.append(m)
        for f in m.model_fields.values():
            todo.extend(_models_in(f.annotation))
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


@pytest.mark.parametrize("name", SENT)
def test_every_field_a_reply_may_omit_defaults_to_none_so_the_reply_parses_back_whole(name: str) -> None:
    for model in _models_under(getattr(contracts, name)):
        for field_name, f in model.model_fields.items():
            if type(None) in get_args(f.annotation):
                assert f.default is None, f"{model.__name__}.{field_name} may be omitted but has no default"


def test_a_reply_travels_without_nulls_and_parses_back_equal() -> None:
    reply = ReadReply(
        ref="ctx://blob/" + "0" * 64,
        total_bytes=3,
        total_lines=1,
        offset=0,
        content="abc",
        sha256_verified=True,
    )
    assert reply.next_offset is None and b"null" not in reply_json(reply)
    assert ReadReply.model_validate_json(reply_json(reply)) == reply
    error = ErrorReply(code=ErrorCode.INTERNAL, message="x", details={"kept": None})
    assert json.loads(reply_json(error))["details"] == {"kept": None}  # free-form JSON keeps its nulls


def test_the_asyncapi_document_is_valid_against_the_official_asyncapi_3_0_0_schema(
    written: dict[str, Any],
) -> None:
    validator = Draft7Validator(ASYNCAPI_3_0_0)
    assert [e.message for e in validator.iter_errors(written["asyncapi.json"])] == []
    # The check can fail: AsyncAPI 2's verbs are not 3.0.0's.
    broken = copy.deepcopy(written["asyncapi.json"])
    next(iter(broken["operations"].values()))["action"] = "publish"
    assert not validator.is_valid(broken)


def test_the_asyncapi_document_names_the_package_and_the_configured_server(written: dict[str, Any]) -> None:
    doc = written["asyncapi.json"]
    assert (doc["info"]["title"], doc["info"]["version"]) == ("ctxfleet", version("ctxfleet"))
    assert doc["servers"]["fleet"]["host"] == "localhost:4250"
    external = asyncapi_document(Settings(nats_url="nats://ops:secret@nats.internal:4333,nats://b:4222"))
    assert external["servers"]["fleet"] == {**external["servers"]["fleet"], "host": "nats.internal:4333"}
    assert "secret" not in json.dumps(external)


def _shape(address: str) -> str:
    # FastStream's declared dead-letter publisher names the thread ({thread}): two subject tokens.
    return re.sub(r"\{[^}]+\}", "*", address.replace("{thread}", "{run_id}.{instance_id}"))


def test_the_asyncapi_document_has_a_channel_for_every_subject_the_workers_subscribe_to(
    written: dict[str, Any],
) -> None:
    subscribed = create_docs_app().schema.to_specification().to_jsonable()["channels"].values()
    ours = {_shape(c["address"]) for c in written["asyncapi.json"]["channels"].values() if c["address"]}
    assert {_shape(c["address"]) for c in subscribed} <= ours
    assert "ctx.events.*.*.*.*" in ours


def test_every_request_channel_declares_its_reply_and_the_error_reply(written: dict[str, Any]) -> None:
    doc = written["asyncapi.json"]
    replies = {
        op["channel"]["$ref"].rsplit("/", 1)[1]: {
            m["$ref"].rsplit("/", 1)[1] for m in op["reply"]["messages"]
        }
        for op in doc["operations"].values()
        if "reply" in op
    }
    assert replies["prepare"] == {"PreparedContext", "ErrorReply"}
    assert replies["read"] == {"ReadReply", "ErrorReply"}
    assert replies["operation_status"] == {"Receipt", "ErrorReply"}
    assert replies["session_fork"] == {"SessionForked", "ErrorReply"}
    assert replies["compact"] == {"CompactReply", "ErrorReply"}
    assert replies["context_show"] == {"ContextShown", "ErrorReply"}
    assert replies["gateway_check"] == {"FinalCheck", "ErrorReply"}
    assert replies["hooks_register"] == {"HooksRegistered", "ErrorReply"}
    # A hook answers the fleet with its HookReply alone: a hook's error is a timeout or a bad answer.
    assert replies.pop("hooks") == {"HookReply"}
    assert len(replies) == 14 and all("ErrorReply" in r for r in replies.values())


def test_asyncapi_payload_schemas_resolve_inside_the_document(written: dict[str, Any]) -> None:
    doc = written["asyncapi.json"]
    refs = set(re.findall(r'"\$ref": "(#/[^"]+)"', json.dumps(doc)))
    for ref in refs:
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node[part]
    assert not any(ref.startswith("#/$defs") for ref in refs)


class _ShoutRequest(WireModel):
    """A request of a channel some other module adds."""

    words: str


class _Shouted(WireModel):
    """Its reply."""

    loud: str


def test_a_channel_added_to_the_registry_gets_its_operation_reply_and_schemas() -> None:
    shout = Channel(
        "shout",
        "ctx.shout.{tenant}.{run_id}.{instance_id}",
        "receive",
        WireMessage.of(_ShoutRequest),
        "Shout back.",
        replies=(WireMessage.of(_Shouted), WireMessage.of(ErrorReply)),
        headers="RequestHeaders",
    )
    doc = asyncapi_document(Settings(), (*CHANNELS, shout))
    assert doc["channels"]["shout"]["address"] == "ctx.shout.{tenant}.{run_id}.{instance_id}"
    assert set(doc["channels"]["shout"]["parameters"]) == {"tenant", "run_id", "instance_id"}
    reply = doc["operations"]["receive_shout"]["reply"]
    assert [m["$ref"] for m in reply["messages"]] == [
        "#/channels/shout_reply/messages/_Shouted",
        "#/channels/shout_reply/messages/ErrorReply",
    ]
    assert {"_ShoutRequest", "_Shouted"} <= set(doc["components"]["schemas"])
    assert Draft7Validator(ASYNCAPI_3_0_0).is_valid(doc)


def _models_within(annotation: Any, seen: set[type[BaseModel]]) -> None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in seen:
            seen.add(annotation)
            for field in annotation.model_fields.values():
                _models_within(field.annotation, seen)
        return
    for arg in get_args(annotation):
        _models_within(arg, seen)


def test_every_field_a_sent_message_may_omit_as_none_has_a_default_so_clients_parse_it_back() -> None:
    # The fleet omits None fields from what it sends; a field that may be None without a default
    # would make the Python client refuse the fleet's own reply.
    sent: set[type[BaseModel]] = set()
    for channel in CHANNELS:
        for m in (channel.message, *channel.replies):
            if m is not None and m.omits_none:
                _models_within(m.adapter._type, sent)  # noqa: SLF001 - the adapter's own model
    missing = [
        f"{model.__name__}.{name}"
        for model in sent
        for name, field in model.model_fields.items()
        if field.is_required() and type(None) in get_args(field.annotation)
    ]
    assert sent and missing == []


def _hook_call() -> HookCall:
    return HookCall(
        point=HookPoint.PREPARE_BEFORE,
        hook="policy@2",
        tenant="default",
        session_id="s1",
        thread_id="r1.main",
        purpose="action",
        blocks=(HookBlock(block_id="task:2", kind="task", retention="required", tokens=3, text="fix it"),),
    )


def test_the_hooks_channel_is_a_request_the_fleet_sends_and_a_hook_service_answers(
    written: dict[str, Any],
) -> None:
    doc = written["asyncapi.json"]
    assert doc["channels"]["hooks"]["address"] == "hooks.{tenant}.{hook}"
    assert set(doc["channels"]["hooks"]["parameters"]) == {"tenant", "hook"}
    send = doc["operations"]["send_hooks"]
    assert send["action"] == "send" and "receive_hooks" not in doc["operations"]
    assert [m["$ref"] for m in send["messages"]] == ["#/channels/hooks/messages/HookCall"]
    assert [m["$ref"] for m in send["reply"]["messages"]] == ["#/channels/hooks_reply/messages/HookReply"]
    # Neither side carries the fleet's headers: the fleet sets no deadline header on a hook call (the
    # binding's timeout bounds it), and a hook's answer has no ctx-status (its body says it all).
    messages = doc["components"]["messages"]
    assert "headers" not in messages["HookCall"] and "headers" not in messages["HookReply"]


def test_a_hook_call_as_the_fleet_sends_it_satisfies_its_schema_without_nulls(
    written: dict[str, Any],
) -> None:
    body = json.loads(reply_json(_hook_call()))
    assert list(_validator(written, "HookCall").iter_errors(body)) == []
    assert '{"type": "null"}' not in json.dumps(written["HookCall.schema.json"])
    assert not _validator(written, "HookCall").is_valid({**body, "point": "model.chat.before"})


_ADD = {"category": "material", "title": "policy", "text": "Refunds need approval."}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"decision": "continue"},
        {"decision": "patch", "patch": {"add": [_ADD], "deselect": ["material:3"]}},
        {
            "decision": "patch",
            "patch": {"narrow_to": {"from_seq": 1, "to_seq": 4}, "summary_target_tokens": 200},
        },
        {"decision": "patch", "patch": {"narrow_to": None, "summary_fields": {"progress": []}}},
        {"decision": "patch", "patch": {"edit": [{"block_id": "task:2", "text": "other"}]}},
        {"decision": "reject", "reason": "tenant frozen"},
        {"decision": "maybe"},
        {"decision": "patch", "patch": {"summary_target_tokens": 0}},
        {"decision": "patch", "patch": {"add": [{**_ADD, "category": "instruction"}]}},
        {"decision": "continue", "note": "unknown fields are refused"},
    ],
)
def test_the_hook_reply_schema_accepts_exactly_what_its_model_accepts(
    written: dict[str, Any], body: dict[str, Any]
) -> None:
    schema_says, python_says = _agrees(written, HookReply, body)
    assert schema_says == python_says
