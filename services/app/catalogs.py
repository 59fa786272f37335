"""Tool catalogs per agent release: registered, validated, versioned like policies."""

from __future__ import annotations

from contracts import ToolCatalog

from contracts.exceptions import InvalidRequest
from services.core.state import pattern_regex
from services.store.ports import QueryStore

__all__ = ["register_catalog", "validate_catalog"]


def validate_catalog(catalog: ToolCatalog) -> None:
    """Every declared read and effect must land on a registered path pattern of the release."""
    patterns = [pattern_regex(rule.pattern) for rule in catalog.paths]
    for tool in catalog.tools:
        for path in (*tool.reads, *(e.path for e in tool.effects)):
            # Templates ({args.x}, {result.x}, {id}) match any token; check the literal shape.
            probe = path
            for marker in ("{args.", "{result."):
                while marker in probe:
                    start = probe.index(marker)
                    probe = probe[:start] + "X" + probe[probe.index("}", start) + 1 :]
            probe = probe.replace("{", "").replace("}", "")
            if not any(p.match(probe) for p in patterns) and not any(p.match(path) for p in patterns):
                raise InvalidRequest(
                    f"tool {tool.name}: {path!r} matches no registered path of release {catalog.release}"
                )


async def register_catalog(store: QueryStore, tenant: str, catalog: ToolCatalog) -> int:
    """Store ``catalog`` as the next revision of its release in ``tenant``;
    its new sessions of the release pin it."""
    validate_catalog(catalog)
    return await store.register_catalog(tenant, catalog)
