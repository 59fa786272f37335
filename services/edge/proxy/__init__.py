"""``ctxfleet proxy``: the provider APIs the official SDKs call, with the fleet's context in between."""

from .server import ProxyConfig, build_app
from .shapes import Family, find_thread, profile_of

__all__ = ["Family", "ProxyConfig", "build_app", "find_thread", "profile_of"]
