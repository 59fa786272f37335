"""Operation receipts: what a recovering runtime asks before it re-executes a side effect."""

from __future__ import annotations

from contracts import OperationStatusRequest, Receipt

from contracts.exceptions import ContentNotFound
from services.store.ports import QueryStore

__all__ = ["operation_status"]


async def operation_status(store: QueryStore, request: OperationStatusRequest, *, tenant: str) -> Receipt:
    """The receipt of an operation of the asking session of ``tenant``;
    requested-but-unfinished stays ``requested``."""
    receipt = await store.receipt(tenant, request.session_id, request.operation_id, request.principal_id)
    if receipt is None:
        raise ContentNotFound(f"operation {request.operation_id}")
    return receipt
