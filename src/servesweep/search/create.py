"""The search of a sweep: a grid or a sampler, chosen by the sweep file.

Here and not on :class:`~servesweep.search.base.Search`, so that the base never imports
its implementations (which import it); the sampler (and Optuna) is imported only for a
sweep that samples.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from servesweep.decide.perf import Measured, Setting
from servesweep.search.base import History, MemoryOver, Search
from servesweep.search.grid import GridSearch
from servesweep.spec.schema import SweepSpec

__all__ = ["create_search"]


def create_search(
    spec: SweepSpec,
    history: History = (),
    only: Collection[str] | None = None,
    guide: Setting | None = None,
    earlier: Sequence[Measured] = (),
    memory: MemoryOver | None = None,
) -> Search:
    """The search of this sweep, continued from its stored trials.

    A grid continues in its order (``only``: exactly the configurations of these
    fingerprints, see :mod:`servesweep.search.grid`); a sampler replays the stored
    trials so that the same seed gives the same sequence of proposals, and nothing
    measured is proposed again. ``guide``: what the performance predictor is told, when
    the driver's performance gate skips what cannot win (a sampler then launches first
    what the prediction says can, :mod:`servesweep.decide.perf.design`; None: the
    sampler alone, as with ``run --no-predict``); ``earlier``: the earlier sweeps'
    measurements the performance gate starts from, which start the guide warm too;
    ``memory``: the memory gate's prediction, which the guide keeps clear of (given
    here, not after: the replay asks the guide again as the first run did). A grid
    needs neither."""
    if spec.search.samples:
        from servesweep.search.sampled import SampledSearch

        return SampledSearch(spec, history, guide, earlier, memory)
    return GridSearch(spec, history, only)
