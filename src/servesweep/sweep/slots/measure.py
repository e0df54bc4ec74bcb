"""What a slot measures in one launch of a configuration, as plain decisions: which
workloads (:func:`launch_workloads`), whether to go on after each level
(:class:`LevelGate`: the sweep stopping, pruning), and whether the levels measured
failed too many requests (:func:`check_errors`). The slot carries them out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from servesweep.bench.capacity import error_checked
from servesweep.bench.target import Target
from servesweep.decide.prune import PrunePolicy, prune_reason
from servesweep.errors import TrialFailed
from servesweep.models import Evidence, FailureClass, LevelResult
from servesweep.servers.engines import EnginePreset
from servesweep.spec.schema import (
    CapacityWorkload,
    EvalWorkload,
    LoadWorkload,
    ServerSpec,
    SweepSpec,
    WorkloadSpec,
)
from servesweep.spec.screening import screening_plan

__all__ = [
    "DYING_GRACE_S",
    "LevelGate",
    "check_errors",
    "launch_workloads",
    "screening_workloads",
    "slot_target",
]

DYING_GRACE_S = 2.0
"""How long a server whose requests failed may take to show that it exited."""


def launch_workloads(
    spec: SweepSpec, launch: int, *, relaunch: bool = False, warmed: bool = False
) -> list[WorkloadSpec]:
    """The workloads measured in launch ``launch`` of a configuration (all in the
    first; in a later one those whose ``launches`` reach it; ``relaunch``: the confirm
    phase, every workload a launch can measure again). The launch's first load workload
    with ``warmup: auto`` warms the fresh server until it settles, unless the launch is
    ``warmed`` already (its screening levels ran first, warm-up included)."""
    if relaunch:
        workloads: list[WorkloadSpec] = [
            w for w in spec.workloads if not isinstance(w, CapacityWorkload)
        ]
    else:
        workloads = [w for w in spec.workloads if spec.launches_of(w) > launch]
    return workloads if warmed else _warm_first(workloads)


def _warm_first(workloads: list[WorkloadSpec]) -> list[WorkloadSpec]:
    loads = [w for w in workloads if isinstance(w, LoadWorkload)]
    if loads and loads[0].warmup == "auto":
        warm = loads[0].model_copy(update={"warmup": "launch"})
        workloads = [warm if w is loads[0] else w for w in workloads]
    return workloads


def screening_workloads(spec: SweepSpec) -> list[WorkloadSpec]:
    """The short levels of the screening pass (``spec.screening``), measured first in
    a configuration's first launch: the launch's warm-up goes with the first of them."""
    plan = screening_plan(spec)
    return [] if plan is None else _warm_first(list(plan.workloads))


def _levels(workload: WorkloadSpec) -> int:
    """How many level results a workload gives (for telling whether any come after)."""
    if not isinstance(workload, LoadWorkload):
        return 1
    return (len(workload.concurrency) + len(workload.rate)) * workload.repeats


class LevelGate:
    """Asked after each level result of a launch's ``workloads``: whether to go on
    benchmarking. Not once the sweep is being stopped (``cancelled``), nor, with a
    prune ``policy``, once the trial can no longer win (then :attr:`pruned` says why);
    the last level of all is never pruned."""

    def __init__(
        self,
        workloads: Sequence[WorkloadSpec],
        policy: PrunePolicy | None,
        cancelled: Callable[[], bool],
        phase_seconds: Mapping[str, float],
    ) -> None:
        self._left = sum(_levels(w) for w in workloads)
        self._policy = policy
        self._cancelled = cancelled
        self._phase_seconds = phase_seconds
        self.measured: list[LevelResult] = []
        self.pruned: str | None = None
        """Why the trial was pruned (the first reason found), or None."""

    def __call__(self, result: LevelResult) -> bool:
        self.measured.append(result)
        self._left -= 1
        if self._cancelled():
            return False
        if self._policy is None or self._left <= 0:
            return True
        reason = prune_reason(self._policy, self.measured, self._phase_seconds)
        if reason:
            self.pruned = self.pruned or reason
            return False
        return True


def check_errors(workload: WorkloadSpec, results: Sequence[LevelResult]) -> None:
    """TrialFailed (``bench_errors``) when a level failed more requests than the
    workload's ``max_error_rate`` allows."""
    if isinstance(workload, EvalWorkload):
        return
    # a capacity search goes beyond the load the server sustains on purpose: only the
    # levels it judged are held to the error limit
    for result in error_checked(workload, results):
        rate = result.metrics.get("error_rate", 0.0)
        if rate > workload.max_error_rate:
            errors = result.info.get("errors_by_type") or result.info.get("errors") or {}
            raise TrialFailed(
                FailureClass.BENCH_ERRORS,
                Evidence(
                    message=(
                        f"{workload.name} {result.level}: {rate:.1%} of requests failed "
                        f"(limit {workload.max_error_rate:.1%})"
                    ),
                    reason="error_rate",
                    details={"errors": errors, "level": result.level},
                ),
            )


def slot_target(
    server: ServerSpec, preset: EnginePreset, model: str, api_key: str | None
) -> Target:
    """The load generator's view of a slot's server, serving ``model``."""
    return Target(
        base_url=f"http://{server.host}:{server.port}",
        model=model,
        api_key=api_key,
        request_extras=dict(preset.request_extras),
        supports_ignore_eos=preset.supports_ignore_eos,
        metrics_path=preset.metrics_path,
        tokenize_path=preset.tokenize_path,
        spec_decode_counters=dict(preset.spec_decode_counters),
        spec_counters_when_speculating=preset.spec_counters_when_speculating,
        timeout_s=server.timeouts.request,
    )
