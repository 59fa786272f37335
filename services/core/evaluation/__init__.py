"""Offline evaluation of what the model sees: traces → baseline contexts, probes and metrics (no I/O)."""

from services.core.evaluation import baselines, chat, fair_count, probes, scoring
from services.core.evaluation.baselines import *  # noqa: F403
from services.core.evaluation.chat import *  # noqa: F403
from services.core.evaluation.fair_count import *  # noqa: F403
from services.core.evaluation.probes import *  # noqa: F403
from services.core.evaluation.scoring import *  # noqa: F403

# The package exports each of these modules whole.
__all__: list[str] = []
__all__ += baselines.__all__
__all__ += chat.__all__
__all__ += fair_count.__all__
__all__ += probes.__all__
__all__ += scoring.__all__
