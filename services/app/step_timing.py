"""Where a recorded batch's and a prepare's time went, told to whoever measures it.

A read-your-writes step after an agent's pause can cost twice what it costs back to back with no
single stage to blame: each of its round trips and pieces of Python runs cold
(docs/measurements.md). So the recorder and the assembler report the seconds of each stage as it ends; the
workers export them (``ctx_record_stage_seconds``, ``ctx_prepare_stage_seconds``) and the ``think``
benchmark splits each pause's steps with them. The services stay free of metrics: they call a plain
function, which does nothing unless a worker gives them one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeAlias

__all__ = [
    "PREPARE_STAGES",
    "RECORD_STAGES",
    "PrepareStage",
    "PrepareStages",
    "RecordStage",
    "RecordStages",
    "ignore_stage",
]

# read: the session and the ledger's state the batch's plan needs (one statement); plan: the plan, in
# Python; write: the dead letters and the statement(s) that commit the batch.
RecordStage: TypeAlias = Literal["read", "plan", "write"]
# wait: until the ledger holds the event the request names (overlaps the recorder's stages), the view
# read with it; load: the view read from the ledger, for a request naming no event; assemble: from the
# view in hand to the context built (hooks, window, assembly, and a wait for compaction when the view
# is over budget, which ``ctx_prepare_compaction_wait_seconds`` has alone).
PrepareStage: TypeAlias = Literal["wait", "load", "assemble"]
RECORD_STAGES: tuple[RecordStage, ...] = ("read", "plan", "write")
PREPARE_STAGES: tuple[PrepareStage, ...] = ("wait", "load", "assemble")

RecordStages: TypeAlias = Callable[[RecordStage, float], None]
PrepareStages: TypeAlias = Callable[[PrepareStage, float], None]


def ignore_stage(stage: str, seconds: float) -> None:
    """The observer of a service that nobody measures."""
