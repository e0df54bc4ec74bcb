"""servesweep.spec: the sweep file, its validation, its expansion into a plan.

Load a file with :func:`load_sweep` (every mistake is a one-line ``ConfigError``),
expand it with :func:`expand_configs` or :func:`build_plan` (a sampling search: its
space with :func:`build_space`), and read metric references and constraints with
:func:`parse_metric_ref` / :func:`parse_constraint`.
"""

from servesweep.spec.constraints import (
    CAPACITY_METRICS,
    EVAL_METRICS,
    LEVEL_METRICS,
    TRIAL_METRICS,
    Constraint,
    MetricRef,
    objective_direction,
    parse_constraint,
    parse_metric_ref,
    resolve_objective,
    resolve_objectives,
    validate_constraints,
    validate_ref,
    workload_levels,
)
from servesweep.spec.expand import expand_configs, param_key
from servesweep.spec.load import LoadedSweep, load_sweep, load_sweep_text
from servesweep.spec.plan import (
    Plan,
    PlanTrial,
    PlanWorkload,
    SearchOutline,
    build_plan,
    estimate_duration,
    format_duration,
    format_plan,
)
from servesweep.spec.schema import (
    CapacitySpec,
    CapacityWorkload,
    EvalWorkload,
    LoadWorkload,
    Objective,
    ParamRange,
    ParamsSpec,
    SearchSpec,
    ServerSpec,
    SweepSpec,
    WorkloadSpec,
    parse_duration,
    parse_size,
    workload_spec,
)
from servesweep.spec.space import SearchSpace, build_space
from servesweep.spec.when import WhenExpr, compile_when

__all__ = [
    "CAPACITY_METRICS",
    "EVAL_METRICS",
    "LEVEL_METRICS",
    "TRIAL_METRICS",
    "CapacitySpec",
    "CapacityWorkload",
    "Constraint",
    "EvalWorkload",
    "LoadWorkload",
    "LoadedSweep",
    "MetricRef",
    "Objective",
    "ParamRange",
    "ParamsSpec",
    "Plan",
    "PlanTrial",
    "PlanWorkload",
    "SearchOutline",
    "SearchSpace",
    "SearchSpec",
    "ServerSpec",
    "SweepSpec",
    "WhenExpr",
    "WorkloadSpec",
    "build_plan",
    "build_space",
    "compile_when",
    "estimate_duration",
    "expand_configs",
    "format_duration",
    "format_plan",
    "load_sweep",
    "load_sweep_text",
    "objective_direction",
    "param_key",
    "parse_constraint",
    "parse_duration",
    "parse_metric_ref",
    "parse_size",
    "resolve_objective",
    "resolve_objectives",
    "validate_constraints",
    "validate_ref",
    "workload_levels",
    "workload_spec",
]
