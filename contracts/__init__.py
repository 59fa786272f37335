"""The wire: every message the fleet takes or gives, its subjects and its error codes.

Imports nothing of ours; runtimes in other languages use the JSON Schemas generated from here.
"""

from . import branches, errors, events, gateway, hooks, ids, inspect, jobs, manage, notices, policy, prepare
from . import read, search, state
from ._base import reply_json
from .branches import *  # noqa: F403
from .errors import *  # noqa: F403
from .events import *  # noqa: F403
from .gateway import *  # noqa: F403
from .hooks import *  # noqa: F403
from .ids import *  # noqa: F403
from .inspect import *  # noqa: F403
from .jobs import *  # noqa: F403
from .manage import *  # noqa: F403
from .notices import *  # noqa: F403
from .policy import *  # noqa: F403
from .prepare import *  # noqa: F403
from .read import *  # noqa: F403
from .search import *  # noqa: F403
from .state import *  # noqa: F403

# The package exports each of these modules whole.
__all__ = ["reply_json"]
__all__ += branches.__all__
__all__ += errors.__all__
__all__ += events.__all__
__all__ += gateway.__all__
__all__ += hooks.__all__
__all__ += ids.__all__
__all__ += inspect.__all__
__all__ += jobs.__all__
__all__ += manage.__all__
__all__ += notices.__all__
__all__ += policy.__all__
__all__ += prepare.__all__
__all__ += read.__all__
__all__ += search.__all__
__all__ += state.__all__
