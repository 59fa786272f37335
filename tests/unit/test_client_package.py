"""The client distribution's own surface: its address from the environment, its hash, its constants."""

from __future__ import annotations

from typing import get_args

import pytest

from contracts import RequestFormat, UserInputEvent, UserInputPayload
from contracts.task_budgets import TaskBudget
from ctxfleet_client import (
    BUILTIN_PROFILES,
    FORMATS,
    OPENAI_CHAT,
    PROFILE_NAMES,
    FleetAddress,
    FleetClient,
    InvalidConfiguration,
    PrepareRequest,
    content_sha256,
)
from services.core.ledger import content_sha256_of
from tests.fixtures.builders import sample_trace_events

pytestmark = pytest.mark.anyio


def test_fleet_address_from_env_reads_every_line_ctxfleet_env_prints() -> None:
    env = {
        "CTX_NATS_URL": "nats://127.0.0.1:4222, nats://127.0.0.1:4223",
        "CTX_NATS_USER": "runtime-acme",
        "CTX_NATS_PASSWORD": "s3cret",
        "CTX_TENANT": "acme",
    }
    assert FleetAddress.from_env(env) == FleetAddress(
        servers=("nats://127.0.0.1:4222", "nats://127.0.0.1:4223"),
        user="runtime-acme",
        password="s3cret",
        tenant="acme",
    )


def test_fleet_address_from_env_defaults_to_the_default_tenant_and_url_credentials() -> None:
    address = FleetAddress.from_env({"CTX_NATS_URL": "nats://u:p@127.0.0.1:4222"})
    assert (address.tenant, address.user, address.options()) == ("default", None, {})


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({}, "CTX_NATS_URL is not set"),
        ({"CTX_NATS_URL": "http://127.0.0.1:4222"}, "must be nats://"),
        ({"CTX_NATS_URL": "nats://127.0.0.1:4222", "CTX_NATS_PASSWORD": "p"}, "without CTX_NATS_USER"),
        ({"CTX_NATS_URL": "nats://127.0.0.1:4222", "CTX_TENANT": "a.b"}, "tenant"),
    ],
)
async def test_fleet_client_from_env_refuses_a_missing_or_malformed_line_before_connecting(
    env: dict[str, str], problem: str
) -> None:
    with pytest.raises(InvalidConfiguration, match=problem):
        await FleetClient.from_env(env)


def test_content_sha256_is_the_hash_the_ledger_records_for_every_sample_event() -> None:
    events = sample_trace_events("s-hash")
    budgeted = UserInputEvent(
        event_key="k-budget",
        session_id="s-hash",
        run_id="r",
        instance_id="i",
        payload=UserInputPayload(text="é ✓ \u2028"),
        task_budget=TaskBudget(total_tokens=1000),
    )
    for event in [*events, budgeted]:
        assert content_sha256(event) == content_sha256_of(event)


def test_profile_and_format_constants_are_the_ones_a_prepare_request_accepts() -> None:
    assert FORMATS == get_args(RequestFormat)
    assert PROFILE_NAMES == tuple(BUILTIN_PROFILES)
    for name in PROFILE_NAMES:
        request = PrepareRequest(
            session_id="s", run_id="r", instance_id="i", model_profile=name, format=OPENAI_CHAT
        )
        assert request.model_profile == name
