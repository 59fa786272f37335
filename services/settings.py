"""The fleet's configuration: one typed object, read from ``CTX_*`` environment variables."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "default_data_dir", "parse_partitions"]


def default_data_dir() -> Path:
    """``.ctxfleet`` in the checkout whose ``.venv`` runs us, else in the current directory.

    So ``.venv/bin/ctxfleet`` finds the fleet that ``make run`` started, from any terminal.
    """
    prefix = Path(sys.prefix)
    if prefix.name == ".venv":
        return prefix.parent / ".ctxfleet"
    return Path.cwd() / ".ctxfleet"


def parse_partitions(spec: str, partitions: int) -> tuple[int, ...]:
    """``"all"``, ``"3"``, ``"0-7"``, ``"0-3,8,12-15"`` or ``"i/k"`` (replica i of k) → partitions."""
    spec = spec.strip()
    if spec == "all":
        return tuple(range(partitions))
    if "/" in spec:
        index, count = (int(x) for x in spec.split("/", 1))
        if not 0 <= index < count:
            raise ValueError(f"replica {index} of {count} does not exist")
        return tuple(p for p in range(partitions) if p % count == index)
    chosen: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        chosen.extend(range(int(lo), int(hi or lo) + 1))
    bad = [p for p in chosen if not 0 <= p < partitions]
    if bad:
        raise ValueError(f"partitions {bad} are outside 0..{partitions - 1}")
    return tuple(sorted(set(chosen)))


class Settings(BaseSettings):
    """Every knob of the fleet. Unset URLs mean: start the embedded servers."""

    model_config = SettingsConfigDict(env_prefix="CTX_", extra="ignore", frozen=True)

    nats_url: str | None = None
    database_url: str | None = None
    data_dir: Path = Field(default_factory=default_data_dir)
    partitions: Annotated[int, Field(ge=1, le=1024)] = 16
    recorder_partitions: str = "all"
    recorder_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    record_batch: Annotated[int, Field(ge=1, le=4096)] = 256
    max_event_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    blob_min_bytes: Annotated[int, Field(ge=1)] = 4096
    tool_result_max_tokens: Annotated[int, Field(ge=50)] = 2000
    db_pool_size: Annotated[int, Field(ge=2, le=200)] = 10
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0
    workers: str = "recorder,assembler,budgeter,compactor,indexer"
    compaction_wait_ms: Annotated[int, Field(ge=0, le=120_000)] = 5_000
    summarizer: Literal["structured", "openai"] = "structured"
    summarizer_base_url: str | None = None
    summarizer_model: str | None = None
    summarizer_api: Literal["chat_completions", "responses"] = "chat_completions"
    summarizer_api_key: SecretStr | None = None
    nats_max_payload: Annotated[int, Field(ge=1024 * 1024, le=64 * 1024 * 1024)] = 16 * 1024 * 1024

    @field_validator("workers")
    @classmethod
    def _known_workers(cls, value: str) -> str:
        known = {"recorder", "assembler", "budgeter", "compactor", "indexer"}
        names = [w.strip() for w in value.split(",") if w.strip()]
        unknown = sorted(set(names) - known)
        if unknown or not names:
            raise ValueError(f"unknown workers {unknown}; this build runs: {', '.join(sorted(known))}")
        return ",".join(names)

    @model_validator(mode="after")
    def _summarizer_configured(self) -> Settings:
        if self.summarizer == "openai" and not (self.summarizer_base_url and self.summarizer_model):
            raise ValueError("CTX_SUMMARIZER=openai needs CTX_SUMMARIZER_BASE_URL and CTX_SUMMARIZER_MODEL")
        return self

    @property
    def worker_names(self) -> tuple[str, ...]:
        """The workers this process runs."""
        return tuple(self.workers.split(","))

    def owned_partitions(self) -> tuple[int, ...]:
        """The events partitions this process records."""
        return parse_partitions(self.recorder_partitions, self.partitions)
