"""Who may publish and subscribe to what on NATS: one user per worker kind, provisioning, operators, tenants.

A tenant is an identity, never a payload field: each tenant's agent runtimes connect as its own user,
``runtime-<tenant>``, whose grants name only that tenant's subjects (``ctx.events.<tenant>.>``,
``ctx.prepare.<tenant>.>``, ``ctx.read.<tenant>``, …) and its own reply inboxes
(``_INBOX.runtime-<tenant>.>``). The fleet takes the tenant from the subject the server delivered, which
these grants vouch for. The tenants come from configuration (``CTX_TENANTS``); the ``operator`` user
(people, the CLI) may name any tenant. Only the assembler subscribes to request subjects, only the
recorder reads the partitions and publishes notices, only the budgeter and the assembler put
compaction jobs, only provisioning changes streams — in every deployment, since all of them render
this table.

One table, rendered into ``infra/nats/auth.conf`` (Compose) and checked against ``k8s/nats/values.yaml``
(Helm). A test runs each worker under its own user against a real server and fails on any
permissions violation, so a grant is never a guess that happens to be wide enough. The grants of the
identities clients connect as (``runtime-<tenant>``, ``operator``) live in ``contracts/identities.py``,
because the fleet reads them at run time to decide where an answer may go; this module adds the
fleet's own users and renders the whole table.

``allow_responses`` lets a request handler answer on a reply subject without being allowed to
publish there otherwise. The server checks only that the handler received a message naming that
reply subject, and the sender names it freely, so what the fleet publishes that a request could
steer, and why it stays within the sender's own reach:

- Replies. Only the responder answers (``workers/responder.py``), and only on an inbox of an identity
  whose grants here allow sending that request: ``_INBOX.runtime-<tenant>.`` of the subject's tenant
  or ``_INBOX.operator.`` (``contracts/identities.py``); anything else is dropped unanswered and
  counted (``ctx_replies_refused_total``). Notices and jobs are never answered: FastStream would
  answer their reply subject (or a job's ``reply_to`` header), so every other subscriber is
  ``no_reply``. Without user names on the bus (a token, nkeys, JWTs) the fleet answers any
  ``_INBOX.`` subject, and what else a user may reach is that deployment's own permissions.
- ``allow_responses: true`` is already the server's narrowest form that still answers: one response
  (``max: 1``) per request received, within two minutes; a shorter ``expires`` would cut off a slow
  manual compaction. A runtime's ``allow_responses`` answers the fleet's hook calls, whose reply
  subjects are the fleet's own inboxes.
- Hook calls (``hooks.>``). Their subjects come from a registered hook set, accepted only under the
  registering tenant's ``hooks.<tenant>.`` (``workers/queries.py``), and a prepare or compaction calls
  only the hooks its own tenant's session pinned.
- Compaction jobs go to the one subject ``ctx.compaction.jobs`` and name a thread the asking tenant
  owns (a prepare or manual compaction of another tenant's thread fails as ``thread_not_found`` before
  any job); ``ctx.compacted.<thread>`` follows only a committed compaction of such a thread.
- Notices (``ctx.recorded.<thread>``) and dead letters (``ctx.dead.>``) are the recorder's, from
  events the server let their sender publish on its tenant's subjects; forks and exports write to or
  read from PostgreSQL and publish nothing but their reply; the JetStream API subjects are fixed
  strings of the fleet's own streams and consumers, none built from a request.

Regenerate the Compose file with
``CTX_TENANTS=default,acme python -m infra.nats_accounts > infra/nats/auth.conf`` (the Helm users
with ``--helm``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable, Mapping

from contracts import COMPACTION_JOBS, JOBS_STREAM
from contracts.identities import (
    OPERATOR,
    REQUESTS,
    SubjectPermissions,
    operator_permissions,
    runtime_user,
    tenant_permissions,
)
from contracts.manage import COMPACT
from contracts.subjects import DEAD, DEFAULT_TENANT, EVENTS_STREAM, RECORDED
from services.settings import parse_tenants
from workers.compactor import COMPACTOR_DURABLE

__all__ = [
    "DEFAULT_TENANTS",
    "OPERATOR",
    "WORKERS",
    "SubjectPermissions",
    "authorization_conf",
    "configured_tenants",
    "embedded_grants",
    "fleet_permissions",
    "grants",
    "helm_users",
    "operator_permissions",
    "password_variable",
    "render_auth_conf",
    "runtime_user",
    "tenant_permissions",
    "worker_permissions",
]

WORKERS = ("recorder", "assembler", "budgeter", "compactor", "indexer", "provisioner")
DEFAULT_TENANTS = (DEFAULT_TENANT,)
_INBOX = "_INBOX.>"
# Context hooks answer under hooks.<tenant>. (contracts/hooks.py); the fleet calls them at prepare
# (assembler) and compaction (compactor) time.
_HOOKS = "hooks.>"
_COMPACTED = "ctx.compacted.>"
# The compaction queue gauges (depth, oldest job) that budgeters and compactors export.
_QUEUE_GAUGES = (f"$JS.API.STREAM.INFO.{JOBS_STREAM}", f"$JS.API.STREAM.MSG.GET.{JOBS_STREAM}")


def worker_permissions() -> dict[str, SubjectPermissions]:
    return {
        # Reads its partitions through ephemeral ack-less consumers it creates and deletes itself.
        "recorder": SubjectPermissions(
            publish=(
                f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.>",
                f"$JS.API.CONSUMER.INFO.{EVENTS_STREAM}.*",
                f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.*",
                f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.*",
                # Checks the stream did not go backwards or get re-created under its positions.
                f"$JS.API.STREAM.INFO.{EVENTS_STREAM}",
                f"{DEAD}.>",
                f"{RECORDED}.>",
            ),
            subscribe=(_INBOX,),
        ),
        # Answers requests; enqueues a compaction when a prepare must wait for one.
        "assembler": SubjectPermissions(
            publish=(COMPACTION_JOBS, _HOOKS),
            subscribe=(*REQUESTS, f"{RECORDED}.>", _COMPACTED, _INBOX),
            allow_responses=True,
        ),
        "budgeter": SubjectPermissions(
            publish=(COMPACTION_JOBS, *_QUEUE_GAUGES),
            subscribe=(f"{RECORDED}.>", _INBOX),
        ),
        # Pulls from the durable that provisioning created; never creates or edits consumers.
        "compactor": SubjectPermissions(
            publish=(
                f"$JS.API.CONSUMER.INFO.{JOBS_STREAM}.{COMPACTOR_DURABLE}",
                f"$JS.API.CONSUMER.MSG.NEXT.{JOBS_STREAM}.{COMPACTOR_DURABLE}",
                f"$JS.ACK.{JOBS_STREAM}.{COMPACTOR_DURABLE}.>",
                _COMPACTED,
                *_QUEUE_GAUGES,
                _HOOKS,
            ),
            # Answers manual compactions (ctx.compact), in the compactor process.
            subscribe=(f"{COMPACT}.>", _INBOX),
            allow_responses=True,
        ),
        "indexer": SubjectPermissions(publish=(), subscribe=(f"{RECORDED}.>", _INBOX)),
        # The migration Job: creates and reconciles streams and the compactor's durable.
        "provisioner": SubjectPermissions(publish=("$JS.API.>",), subscribe=(_INBOX,)),
    }


def grants(tenants: Iterable[str] = DEFAULT_TENANTS) -> dict[str, SubjectPermissions]:
    """Every user of a deployment: the worker kinds, provisioning, the operator and one user per tenant."""
    out = {**worker_permissions(), OPERATOR: operator_permissions()}
    for tenant in tenants:
        out[runtime_user(tenant)] = tenant_permissions(tenant)
    return out


def configured_tenants(value: str | None = None) -> tuple[str, ...]:
    """The tenants of ``value``, else of ``CTX_TENANTS`` (comma-separated; ``default`` when unset)."""
    return parse_tenants(value if value is not None else os.environ.get("CTX_TENANTS") or DEFAULT_TENANT)


def fleet_permissions() -> SubjectPermissions:
    """The all-in-one process (``ctxfleet up``, the embedded default): every worker, and provisioning.

    One process runs the five workers on one connection, so it holds their union — still nothing
    a runtime may do: it never publishes events.
    """
    grants = worker_permissions()
    publish = tuple(dict.fromkeys(s for k in WORKERS for s in grants[k].publish))
    subscribe = tuple(dict.fromkeys(s for k in WORKERS for s in grants[k].subscribe))
    return SubjectPermissions(publish=publish, subscribe=subscribe, allow_responses=True)


def embedded_grants(tenants: Iterable[str] = DEFAULT_TENANTS) -> dict[str, SubjectPermissions]:
    """The users of the embedded default's server: :func:`grants` and the all-in-one ``fleet``."""
    return {**grants(tenants), "fleet": fleet_permissions()}


def password_variable(user: str) -> str:
    """The environment variable of the NATS server that holds ``user``'s password."""
    return f"NATS_PASSWORD_{user.upper().replace('-', '_')}"


def authorization_conf(
    password: Callable[[str], str], users: Mapping[str, SubjectPermissions] | None = None
) -> str:
    """A NATS server ``authorization`` block; ``password(user)`` is the value as written in the conf.

    No ``no_auth_user``: a client that does not authenticate as one of ``users`` cannot connect.
    """
    lines = ["authorization {", "  users: ["]
    for user, grant in (users if users is not None else grants()).items():
        lines.append("    {")
        lines.append(f"      user: {json.dumps(user)}")
        lines.append(f"      password: {password(user)}")
        lines.append("      permissions: {")
        lines.append(f"        publish: {_rule(grant.publish)}")
        lines.append(f"        subscribe: {_rule(grant.subscribe)}")
        if grant.allow_responses:
            lines.append("        allow_responses: true")
        lines.append("      }")
        lines.append("    }")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def _rule(subjects: tuple[str, ...]) -> str:
    # No subjects means none at all, said explicitly rather than trusting an empty allow list.
    if not subjects:
        return '{ deny: [">"] }'
    return f"{{ allow: {json.dumps(list(subjects))} }}"


def render_auth_conf(tenants: Iterable[str] = DEFAULT_TENANTS) -> str:
    """``infra/nats/auth.conf``: passwords are the server's environment variables, never in the file."""
    users = grants(tenants)
    header = (
        "# Generated by `python -m infra.nats_accounts` from infra/nats_accounts.py; edit the table, "
        "not this file.\n"
        f"# Tenants: {', '.join(tenants)} (CTX_TENANTS).\n"
        "# Passwords come from the NATS server's environment: "
        + ", ".join(f"${password_variable(u)}" for u in users)
        + ".\n"
    )
    return header + authorization_conf(lambda user: f"${password_variable(user)}", users)


def helm_users(tenants: Iterable[str] = DEFAULT_TENANTS) -> list[dict[str, object]]:
    """The ``authorization.users`` entries of the NATS Helm chart's values (``k8s/nats/values.yaml``)."""
    out: list[dict[str, object]] = []
    for user, grant in grants(tenants).items():
        permissions: dict[str, object] = {
            "publish": {"allow": list(grant.publish)} if grant.publish else {"deny": [">"]},
            "subscribe": {"allow": list(grant.subscribe)} if grant.subscribe else {"deny": [">"]},
        }
        if grant.allow_responses:
            permissions["allow_responses"] = True
        out.append(
            {"user": user, "password": f"<< ${password_variable(user)} >>", "permissions": permissions}
        )
    return out


def _main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m infra.nats_accounts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--tenants", default=None, help="comma-separated tenants (default: $CTX_TENANTS, else 'default')"
    )
    parser.add_argument(
        "--helm", action="store_true", help="print the Helm values' users (YAML) instead of auth.conf"
    )
    args = parser.parse_args()
    tenants = configured_tenants(args.tenants)
    if args.helm:
        print(json.dumps(helm_users(tenants), indent=2))
    else:
        print(render_auth_conf(tenants), end="")


if __name__ == "__main__":
    _main()
