"""The fleet's error tree, under its fleet-side name.

The tree is ``contracts.exceptions``: the client distribution ships it with the wire models, so a
runtime catches exactly the classes the fleet raises and ``error_from_reply`` decodes.
"""

from contracts.exceptions import *  # noqa: F403
from contracts.exceptions import __all__ as __all__
