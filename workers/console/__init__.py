"""The read-only operator console, served beside the operations routes (see ``workers.health``)."""

from __future__ import annotations

from .pages import ShowingSource, StoreSource, console_app, console_url, local_url

__all__ = ["ShowingSource", "StoreSource", "console_app", "console_url", "local_url"]
