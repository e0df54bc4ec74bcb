"""Correctness evals: suites, answer extraction, checkers and the sandbox.

The entry point is :func:`run_eval_workload`; see docs/evals.md.
"""

from servesweep.bench.evals.checkers import check_text
from servesweep.bench.evals.extract import extract_program, normalize_text
from servesweep.bench.evals.runner import build_request, run_eval_workload
from servesweep.bench.evals.sandbox import Sandbox, SandboxLimits, SandboxResult
from servesweep.bench.evals.suites import (
    BUILTIN_SUITES,
    CodingTask,
    Suite,
    Task,
    TextTask,
    load_suite,
    parse_tasks,
)

__all__ = [
    "BUILTIN_SUITES",
    "CodingTask",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "Suite",
    "Task",
    "TextTask",
    "build_request",
    "check_text",
    "extract_program",
    "load_suite",
    "normalize_text",
    "parse_tasks",
    "run_eval_workload",
]
