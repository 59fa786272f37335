"""The fleet's error tree: every error reply is raised as its typed class (``error_from_reply``).

Each class carries its stable ``code`` and ``retryable``: retry a step on a retryable error (say
``FleetUnavailable`` or ``NotYetRecorded``), never on another.
"""

from contracts.exceptions import *  # noqa: F403
from contracts.exceptions import __all__ as __all__
