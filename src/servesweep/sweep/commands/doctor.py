"""``servesweep doctor``: what is on the GPUs, the port and the unit, and does it
generate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesweep.servers.gpu import open_probe
from servesweep.spec.schema import EvalWorkload, WorkloadSpec

__all__ = ["doctor", "format_doctor"]


def doctor(
    sweep_file: Path | None, backend: str = "auto", fake_dir: str | None = None
) -> dict[str, Any]:
    from servesweep.servers.doctor import diagnose

    spec = None
    configs: list[dict[str, Any]] = []
    workloads: list[WorkloadSpec] = []
    store_id = ""
    if sweep_file is not None:
        from servesweep.spec.expand import expand_configs
        from servesweep.spec.load import load_sweep
        from servesweep.sweep.commands.run import fake_gpu_dir, store_path_for

        loaded = load_sweep(sweep_file)
        spec = loaded.spec.server
        workloads = list(loaded.spec.workloads)
        configs = [dict(c.params) for c in expand_configs(loaded.spec)]
        if backend == "auto":
            backend = spec.gpu_backend
        # the sweep's fake GPUs, as `run` sees them (relative to the sweep file)
        fake_dir = fake_dir or fake_gpu_dir(loaded)
        store_id = _store_id(store_path_for(loaded))
    probe = open_probe(backend, fake_dir)
    try:
        report = diagnose(spec, probe, configs, store_id)
    finally:
        probe.close()
    sandboxes, problems = _eval_sandboxes(workloads)
    if sandboxes:
        report["eval_sandbox"] = sandboxes
    if problems:
        report["problems"] = [*report.get("problems", []), *problems]
    return report


def _eval_sandboxes(workloads: list[WorkloadSpec]) -> tuple[dict[str, Any], list[str]]:
    """Which backend runs each eval workload's generated code here and what it
    does not protect; a setting that cannot run here is a problem."""
    from servesweep.bench.evals.sandbox import describe

    settings: dict[str, list[str]] = {}
    for workload in workloads:
        if isinstance(workload, EvalWorkload):
            settings.setdefault(workload.eval.sandbox, []).append(workload.name)
    found: dict[str, Any] = {}
    problems = []
    for setting, names in settings.items():
        found[", ".join(names)] = entry = describe(setting)
        if entry.get("error"):
            problems.append(f"eval workload {', '.join(names)}: {entry['error']}")
    return found, problems


def _store_id(path: Path) -> str:
    """The id of the results database at ``path`` ('' when there is none yet): what
    marks the instances this sweep left running as its own."""
    from servesweep.errors import ServesweepError
    from servesweep.store import open_store

    if not path.exists():
        return ""
    try:
        with open_store(path, readonly=True) as store:
            return store.store_id
    except ServesweepError:
        return ""


def format_doctor(report: dict[str, Any]) -> str:
    """A readable rendering of ``doctor``'s JSON-able dict (nested keys indented)."""
    lines: list[str] = []

    def walk(value: Any, indent: int, key: str | None) -> None:
        pad = "  " * indent
        if isinstance(value, dict):
            if key is not None:
                lines.append(f"{pad}{key}:")
            for k, v in value.items():
                walk(v, indent + (1 if key is not None else 0), str(k))
        elif isinstance(value, list):
            lines.append(f"{pad}{key}:" if key is not None else "")
            if not value:
                lines[-1] += " (none)"
            for item in value:
                if isinstance(item, dict):
                    lines.append(f"{pad}  - " + ", ".join(f"{k}={v}" for k, v in item.items()))
                else:
                    lines.append(f"{pad}  - {item}")
        else:
            lines.append(f"{pad}{key}: {value}")

    walk(report, 0, None)
    return "\n".join(line for line in lines if line != "")
