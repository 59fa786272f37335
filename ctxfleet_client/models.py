"""The wire models: typed events, requests and replies, as the fleet defines and validates them.

They are the fleet's own ``contracts`` package (shipped with this distribution), so what a runtime
builds here is exactly what the fleet accepts; ``ctxfleet schemas`` writes their JSON Schemas.
"""

from contracts import *  # noqa: F403
from contracts import __all__ as __all__
