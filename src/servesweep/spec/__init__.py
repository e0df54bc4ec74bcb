"""servesweep.spec: the sweep file, its validation, its expansion into a plan.

Load a file with :func:`load_sweep` (every mistake is a one-line ``ConfigError``),
expand it with :func:`expand_configs` or :func:`build_plan`, and read metric
references and constraints with :func:`parse_metric_ref` / :func:`parse_constraint`.
"""

from servesweep.spec.constraints import (
    EVAL_METRICS,
    LEVEL_METRICS,
    TRIAL_METRICS,
    Constraint,
    MetricRef,
    objective_direction,
    parse_constraint,
    parse_metric_ref,
    resolve_objective,
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
    build_plan,
    estimate_duration,
    format_duration,
    format_plan,
)
from servesweep.spec.schema import (
    Objective,
    ParamsSpec,
    ServerSpec,
    SweepSpec,
    WorkloadSpec,
    parse_duration,
    parse_size,
)
from servesweep.spec.when import WhenExpr, compile_when

__all__ = [
    "EVAL_METRICS",
    "LEVEL_METRICS",
    "TRIAL_METRICS",
    "Constraint",
    "LoadedSweep",
    "MetricRef",
    "Objective",
    "ParamsSpec",
    "Plan",
    "PlanTrial",
    "PlanWorkload",
    "ServerSpec",
    "SweepSpec",
    "WhenExpr",
    "WorkloadSpec",
    "build_plan",
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
    "validate_constraints",
    "validate_ref",
    "workload_levels",
]
