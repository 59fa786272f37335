"""Who may publish and subscribe to what on NATS: one user per worker kind, plus provisioning and runtimes.

One table, rendered into ``infra/nats/auth.conf`` (Compose) and checked against ``k8s/nats/values.yaml``
(Helm). A test runs each worker under its own user against a real server and fails on any
permissions violation, so a grant is never a guess that happens to be wide enough.

``allow_responses`` lets a request handler answer on the requester's inbox without being allowed
to publish to inboxes at large. Regenerate the Compose file with
``python -m infra.nats_accounts > infra/nats/auth.conf``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from contracts import COMPACTION_JOBS, JOBS_STREAM
from contracts.inspect import SESSION_INSPECT
from contracts.read import POLICY_REGISTER, READ
from contracts.search import SEARCH
from contracts.state import OPERATION_STATUS, TOOLS_REGISTER
from contracts.subjects import DEAD, EVENTS, EVENTS_STREAM, INSPECT, PREPARE, RECORDED
from workers.compactor import COMPACTOR_DURABLE

__all__ = [
    "USERS",
    "SubjectPermissions",
    "authorization_conf",
    "embedded_grants",
    "fleet_permissions",
    "password_variable",
    "render_auth_conf",
    "worker_permissions",
]

USERS = ("recorder", "assembler", "budgeter", "compactor", "indexer", "provisioner", "runtime", "operator")
_INBOX = "_INBOX.>"
_COMPACTED = "ctx.compacted.>"
_REQUESTS = (f"{PREPARE}.>", f"{INSPECT}.>", READ, SEARCH, f"{SESSION_INSPECT}.>", POLICY_REGISTER, TOOLS_REGISTER, OPERATION_STATUS)
# Looking into any thread's ledger or any session's runs (and principals) is an operator's job.
_OPERATOR_ONLY = (f"{INSPECT}.>", f"{SESSION_INSPECT}.>")
_RUNTIME_REQUESTS = tuple(r for r in _REQUESTS if r not in _OPERATOR_ONLY)
# The compaction queue gauges (depth, oldest job) that budgeters and compactors export.
_QUEUE_GAUGES = (f"$JS.API.STREAM.INFO.{JOBS_STREAM}", f"$JS.API.STREAM.MSG.GET.{JOBS_STREAM}")


@dataclass(frozen=True)
class SubjectPermissions:
    """Subjects a user may publish to and subscribe to (NATS wildcards)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False


def worker_permissions() -> dict[str, SubjectPermissions]:
    """The grants of every fleet user, by user name."""
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
            publish=(COMPACTION_JOBS,),
            subscribe=(*_REQUESTS, f"{RECORDED}.>", _COMPACTED, _INBOX),
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
            ),
            subscribe=(_INBOX,),
        ),
        "indexer": SubjectPermissions(publish=(), subscribe=(f"{RECORDED}.>", _INBOX)),
        # The migration Job: creates and reconciles streams and the compactor's durable.
        "provisioner": SubjectPermissions(publish=("$JS.API.>",), subscribe=(_INBOX,)),
        # Agent runtimes: publish events, ask for contexts; never read the ledger's streams or inspect.
        "runtime": SubjectPermissions(publish=(f"{EVENTS}.>", *_RUNTIME_REQUESTS), subscribe=(_INBOX,)),
        # People and the ctxfleet CLI: what a runtime may, plus inspecting threads and sessions.
        "operator": SubjectPermissions(publish=(f"{EVENTS}.>", *_REQUESTS), subscribe=(_INBOX,)),
    }


def fleet_permissions() -> SubjectPermissions:
    """The all-in-one process (``ctxfleet up``, the embedded default): every worker, and provisioning.

    One process runs the five workers on one connection, so it holds their union — still nothing
    a runtime may do: it never publishes events.
    """
    grants = worker_permissions()
    kinds = ("recorder", "assembler", "budgeter", "compactor", "indexer", "provisioner")
    publish = tuple(dict.fromkeys(s for k in kinds for s in grants[k].publish))
    subscribe = tuple(dict.fromkeys(s for k in kinds for s in grants[k].subscribe))
    return SubjectPermissions(publish=publish, subscribe=subscribe, allow_responses=True)


def embedded_grants() -> dict[str, SubjectPermissions]:
    """The users of the embedded default's server: every worker kind, provisioning, runtime, ``fleet``."""
    return {**worker_permissions(), "fleet": fleet_permissions()}


def password_variable(user: str) -> str:
    """The environment variable of the NATS server that holds ``user``'s password."""
    return f"NATS_PASSWORD_{user.upper()}"


def authorization_conf(password: Callable[[str], str], grants: Mapping[str, SubjectPermissions] | None = None) -> str:
    """A NATS server ``authorization`` block; ``password(user)`` is the value as written in the conf.

    No ``no_auth_user``: a client that does not authenticate as one of ``grants`` cannot connect.
    """
    lines = ["authorization {", "  users: ["]
    for user, grant in (grants if grants is not None else worker_permissions()).items():
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


def render_auth_conf() -> str:
    """``infra/nats/auth.conf``: passwords are the server's environment variables, never in the file."""
    header = (
        "# Generated by `python -m infra.nats_accounts` from infra/nats_accounts.py; edit the table, not this file.\n"
        "# Passwords come from the NATS server's environment: "
        + ", ".join(f"${password_variable(u)}" for u in USERS)
        + ".\n"
    )
    return header + authorization_conf(lambda user: f"${password_variable(user)}")


if __name__ == "__main__":
    print(render_auth_conf(), end="")
