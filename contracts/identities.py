"""The identities clients connect as, what each may publish, and where the fleet answers them.

A tenant's agent runtimes connect as ``runtime-<tenant>``; people and the CLI as ``operator``. These
grants are the part of the NATS permission table (``infra/nats_accounts.py``, which renders the
whole table and adds the fleet's own users) that the fleet needs at run time: a request's answer
goes only to the inboxes of an identity that may send that request, ``_INBOX.<user>.…``, and a
client must connect with that inbox prefix (docs/wire.md, "Requests").

Rules:

1. The server vouches for a request's subject (its sender may publish there), never for its reply
   subject: the sender chooses that freely, and the fleet's ``allow_responses`` would let it publish
   there. So the subject names who may have sent it (:func:`requesters`), and only their inboxes may
   be answered (:func:`reply_prefixes`).
2. Grants name a tenant, never a run, session or thread: who may send a request depends on its
   endpoint and tenant alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .branches import SESSION_EXPORT, SESSION_FORK
from .gateway import GATEWAY_CHECK
from .hooks import HOOKS_REGISTER
from .inspect import CONTEXT_SHOW, SESSION_INSPECT
from .manage import COMPACT
from .read import POLICY_REGISTER, READ
from .search import SEARCH
from .state import OPERATION_STATUS, TOOLS_REGISTER
from .subjects import EVENTS, INSPECT, PREPARE, check_tenant

__all__ = [
    "INBOX",
    "OPERATOR",
    "REQUESTS",
    "SubjectPermissions",
    "inbox_prefix",
    "may_publish",
    "operator_permissions",
    "reply_prefixes",
    "requesters",
    "runtime_user",
    "tenant_permissions",
]

INBOX = "_INBOX"
OPERATOR = "operator"
# Request subjects whose last token is the tenant, and those with the tenant then a thread or session.
# A runtime may fork its tenant's sessions (an agent exploring from an earlier point).
_PER_TENANT = (READ, SEARCH, POLICY_REGISTER, TOOLS_REGISTER, HOOKS_REGISTER, OPERATION_STATUS, SESSION_FORK)
# The gateway's final check is a runtime's, like the prepare it follows.
_PER_TENANT_TREE = (PREPARE, GATEWAY_CHECK)
# Looking into a thread's ledger or a session's runs (and principals) is an operator's job.
# Exporting a session writes out every record of it: an operator's, like inspecting; so is showing a
# thread's context as its next prepare would answer it.
_OPERATOR_ONLY = (INSPECT, SESSION_INSPECT, SESSION_EXPORT, CONTEXT_SHOW)
# Every request subject the fleet answers, any tenant (manual compaction, in the compactor, aside).
REQUESTS = (
    *(f"{s}.>" for s in (*_PER_TENANT_TREE, *_OPERATOR_ONLY)),
    *(f"{s}.*" for s in _PER_TENANT),
)


@dataclass(frozen=True)
class SubjectPermissions:
    """Subjects a user may publish to and subscribe to (NATS wildcards)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False


def runtime_user(tenant: str) -> str:
    """The NATS user of ``tenant``'s agent runtimes."""
    return f"runtime-{check_tenant(tenant)}"


def inbox_prefix(user: str | None) -> str:
    """The reply inboxes of ``user`` (``_INBOX.<user>``), the only ones its grants let it read."""
    return f"{INBOX}.{user}" if user else INBOX


def tenant_permissions(tenant: str) -> SubjectPermissions:
    """``tenant``'s runtimes: publish its events, ask its requests; read replies on their own inboxes only.

    Never the ledger's streams, the JetStream API, compaction jobs, notices or another tenant's
    subjects; never inspection. Their clients must use the inbox prefix ``_INBOX.<user>``
    (``FleetClient`` does), or no reply can reach them.
    """
    t = check_tenant(tenant)
    return SubjectPermissions(
        publish=(
            f"{EVENTS}.{t}.>",
            *(f"{s}.{t}.>" for s in _PER_TENANT_TREE),
            *(f"{s}.{t}" for s in _PER_TENANT),
            f"{COMPACT}.{t}.>",
        ),
        # Its own context hooks, which the fleet calls and the runtime (or its plugin service) answers.
        subscribe=(f"{inbox_prefix(runtime_user(t))}.>", f"hooks.{t}.>"),
        allow_responses=True,
    )


def operator_permissions() -> SubjectPermissions:
    """People and the ctxfleet CLI: any tenant's events and requests, and inspecting threads and sessions."""
    return SubjectPermissions(
        publish=(f"{EVENTS}.>", *REQUESTS, f"{COMPACT}.>"), subscribe=(f"{inbox_prefix(OPERATOR)}.>",)
    )


def may_publish(permissions: SubjectPermissions, subject: str) -> bool:
    """Whether ``permissions`` let a user publish to ``subject`` (a subject without wildcards)."""
    return _matcher(permissions.publish).fullmatch(subject) is not None


def requesters(subject: str, tenant: str | None) -> tuple[str, ...]:
    """The users who may send a request on ``subject``, whose tenant token is ``tenant`` (rule 1).

    ``tenant`` is None for a subject without one: then only tenant-independent users may.
    """
    return _requesters(subject, _tenant_or_none(tenant))


def reply_prefixes(subject: str, tenant: str | None) -> tuple[str, ...]:
    """Where the answer to a request on ``subject`` may go: ``_INBOX.<user>.`` of each requester."""
    return tuple(f"{inbox_prefix(user)}." for user in requesters(subject, tenant))


def _requesters(subject: str, tenant: str | None) -> tuple[str, ...]:
    users = [OPERATOR] if may_publish(_OPERATOR_GRANTS, subject) else []
    if tenant is not None and may_publish(_runtime_grants(tenant), subject):
        users.append(runtime_user(tenant))
    return tuple(users)


def _tenant_or_none(tenant: str | None) -> str | None:
    # A token no tenant may have (a subject sent by the operator) names no runtime user.
    if tenant is None:
        return None
    try:
        return check_tenant(tenant)
    except ValueError:
        return None


_OPERATOR_GRANTS = operator_permissions()


# Per tenant seen, bounded: on a closed bus only configured tenants' runtimes (and the operator) publish.
@lru_cache(maxsize=1024)
def _runtime_grants(tenant: str) -> SubjectPermissions:
    return tenant_permissions(tenant)


@lru_cache(maxsize=1024)
def _matcher(subjects: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern for NATS subjects: ``*`` is one token, a final ``>`` one or more."""

    def token(t: str) -> str:
        return {"*": r"[^.]+", ">": r"[^.]+(?:\.[^.]+)*"}.get(t, re.escape(t))

    return re.compile("|".join("(?:" + r"\.".join(token(t) for t in s.split(".")) + ")" for s in subjects))
