"""The NATS grants table: each tenant's runtime user names its own tenant's subjects and nothing else."""

from __future__ import annotations

import re

import pytest

from contracts.identities import may_publish, reply_prefixes, requesters
from infra.asyncapi import CHANNELS, Channel
from infra.nats_accounts import (
    OPERATOR,
    WORKERS,
    embedded_grants,
    grants,
    helm_users,
    password_variable,
    render_auth_conf,
    runtime_user,
    tenant_permissions,
)


def _matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def _may_publish(user: str, subject: str) -> bool:
    grant = grants(("acme", "globex"))[user]
    return any(_matches(p, subject) for p in grant.publish)


def test_a_tenants_runtime_may_use_its_own_subjects_and_no_other_tenants() -> None:
    own = [
        "ctx.events.acme.s1.r1.main",
        "ctx.prepare.acme.r1.main",
        "ctx.read.acme",
        "ctx.search.acme",
        "ctx.policy.register.acme",
        "ctx.tools.register.acme",
        "ctx.operation.status.acme",
    ]
    assert all(_may_publish("runtime-acme", s) for s in own)
    foreign = [s.replace(".acme", ".globex") for s in own] + [
        "ctx.inspect.acme.r1.main",
        "ctx.session.inspect.acme.s1",
        "ctx.compaction.jobs",
        "ctx.recorded.r1.main",
        "ctx.p.0.acme.s1.r1.main",
        "$JS.API.STREAM.INFO.CTX_EVENTS",
        "ctx.events.acme",
        "ctx.read.acme.x",
    ]
    assert not any(_may_publish("runtime-acme", s) for s in foreign), [
        s for s in foreign if _may_publish("runtime-acme", s)
    ]
    # Its own inbox, and the context hooks it answers for its own releases only.
    assert tenant_permissions("acme").subscribe == ("_INBOX.runtime-acme.>", "hooks.acme.>")


def test_the_operator_may_name_any_tenant_and_inspect_but_never_touches_streams_or_jobs() -> None:
    for subject in (
        "ctx.events.globex.s.r.i",
        "ctx.inspect.acme.r.i",
        "ctx.session.inspect.globex.s",
        "ctx.read.acme",
    ):
        assert _may_publish(OPERATOR, subject), subject
    for subject in (
        "ctx.compaction.jobs",
        "$JS.API.STREAM.DELETE.CTX_EVENTS",
        "ctx.recorded.r.i",
        "ctx.p.0.a.s.r.i",
    ):
        assert not _may_publish(OPERATOR, subject), subject


def test_only_the_assembler_among_the_fleet_subscribes_to_requests_and_only_the_recorder_publishes_notices() -> (  # noqa: E501
    None
):
    users = grants(("acme",))
    requests = ("ctx.prepare.acme.r.i", "ctx.read.acme", "ctx.session.inspect.acme.s")
    for user, grant in users.items():
        listens = any(_matches(p, s) for p in grant.subscribe for s in requests)
        assert listens == (user == "assembler"), user
        notices = any(_matches(p, "ctx.recorded.r.i") for p in grant.publish)
        assert notices == (user == "recorder"), user
        jobs = any(_matches(p, "ctx.compaction.jobs") for p in grant.publish)
        assert jobs == (user in ("assembler", "budgeter")), user
        streams = any(_matches(p, "$JS.API.STREAM.UPDATE.CTX_EVENTS") for p in grant.publish)
        assert streams == (user == "provisioner"), user
    assert set(users) == {*WORKERS, OPERATOR, "runtime-acme"}


def test_every_configured_tenant_gets_a_user_and_a_password_variable_in_every_rendering() -> None:
    conf = render_auth_conf(("default", "acme-eu"))
    assert "$NATS_PASSWORD_RUNTIME_ACME_EU" in conf and '"runtime-acme-eu"' in conf
    assert password_variable(runtime_user("acme-eu")) == "NATS_PASSWORD_RUNTIME_ACME_EU"
    helm = {u["user"]: u for u in helm_users(("default", "acme-eu"))}
    assert helm["runtime-acme-eu"]["password"] == "<< $NATS_PASSWORD_RUNTIME_ACME_EU >>"
    assert re.search(r"ctx\.events\.acme-eu\.>", str(helm["runtime-acme-eu"]["permissions"]))
    with pytest.raises(ValueError, match="tenant"):
        runtime_user("acme.eu")


_TRICKY = (
    "ctx.read.acme",
    "ctx.read.acme.x",
    "ctx.read",
    "ctx.prepare.acme",
    "ctx.prepare.acme.r",
    "ctx.prepare.acme.r.main",
    "ctx.prepare.acmex.r.main",
    "ctx.events.acme.s.r.main",
    "ctx.compact.acme.r.main",
    "ctx.session.export.acme.s1",
    "ctx.session.export.acme.s1.x",
    "$JS.API.STREAM.PURGE.CTX_EVENTS",
    "$JS.API.STREAM.INFO.CTX_JOBS",
    "hooks.acme.h1",
    "_INBOX.runtime-acme.x",
)


@pytest.mark.parametrize("user", sorted(embedded_grants(("acme", "globex"))))
def test_may_publish_matches_subjects_as_nats_wildcards_do(user: str) -> None:
    grant = embedded_grants(("acme", "globex"))[user]
    for subject in _TRICKY:
        assert may_publish(grant, subject) == any(_matches(p, subject) for p in grant.publish), subject


def _instance(address: str, tenant: str) -> str:
    values = {"tenant": tenant, "run_id": "r1", "instance_id": "main", "session_id": "s1"}
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], address)


@pytest.mark.parametrize(
    "channel", [c for c in CHANNELS if c.action == "receive" and c.replies], ids=lambda c: c.key
)
def test_who_may_send_each_request_and_be_answered_is_exactly_who_the_grants_table_lets_publish_it(
    channel: Channel,
) -> None:
    # The reply rule reads the requesters from contracts/identities.py; the whole table (worker users,
    # the all-in-one fleet user, every tenant) must agree, so no second list can drift from it.
    table = embedded_grants(("acme", "globex"))
    for tenant in ("acme", "globex"):
        subject = _instance(channel.address, tenant)
        allowed = {u for u, g in table.items() if any(_matches(p, subject) for p in g.publish)}
        assert set(requesters(subject, tenant)) == allowed, subject
        assert OPERATOR in allowed  # people may ask anything of any tenant
        assert reply_prefixes(subject, tenant) == tuple(f"_INBOX.{u}." for u in requesters(subject, tenant))
