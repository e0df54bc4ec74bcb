"""Standalone lifecycle tools: ``wait-gpus`` (the release gate for shell scripts)
and ``doctor`` (what is on the GPUs, the port and the unit, and does it generate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servesweep.errors import ConfigError, TrialFailed
from servesweep.models import short_cmdline
from servesweep.servers.gpu import open_probe
from servesweep.servers.release import ReleasePolicy, wait_released
from servesweep.spec.schema import EvalWorkload, WorkloadSpec, parse_duration, parse_size

__all__ = ["doctor", "format_doctor", "parse_gpu_list", "wait_gpus"]


def parse_gpu_list(text: str) -> list[int]:
    """``0-3,6`` -> ``[0, 1, 2, 3, 6]``."""
    gpus: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise ValueError(part)
                gpus.extend(range(int(lo), int(hi) + 1))
            else:
                gpus.append(int(part))
    except ValueError:
        raise ConfigError(
            f"not a GPU list: {text!r} (use e.g. 0-7 or 0,1,2)", key="--gpus"
        ) from None
    if not gpus or any(g < 0 for g in gpus):
        raise ConfigError(f"not a GPU list: {text!r} (use e.g. 0-7 or 0,1,2)", key="--gpus")
    return sorted(set(gpus))


def _parse(kind: str, value: str, flag: str) -> float:
    try:
        return parse_size(value) if kind == "size" else parse_duration(value)
    except ValueError as exc:
        raise ConfigError(str(exc), key=flag) from None


def wait_gpus(
    gpus: str,
    tolerance: str,
    timeout: str,
    settle: str,
    backend: str = "auto",
    fake_dir: str | None = None,
) -> tuple[bool, str]:
    """Wait until no process holds memory on the GPUs and used memory is within the
    tolerance of zero; returns (free, message naming the holders if not). Raises
    ``NoGpuDriverError`` when no backend can see the GPUs (never "free" unchecked)."""
    indexes = parse_gpu_list(gpus)
    if backend == "none":
        raise ConfigError("--backend none checks no GPU: use auto, nvml or fake", key="--backend")
    probe = open_probe(backend, fake_dir, gpus=indexes)
    try:
        result = wait_released(
            probe,
            indexes,
            {g: 0 for g in indexes},
            ReleasePolicy(
                tolerance=int(_parse("size", tolerance, "--tolerance")),
                settle=_parse("duration", settle, "--settle"),
                timeout=_parse("duration", timeout, "--timeout"),
            ),
            old_pids=set(),
        )
    except TrialFailed as failure:
        return False, f"GPUs {gpus} not free: {failure.evidence.message}" + "".join(
            f"\n  {h.describe()}  {short_cmdline(h.cmdline)}" for h in failure.evidence.gpu_holders
        )
    finally:
        probe.close()
    return True, f"GPUs {gpus} free after {result.seconds:.2f}s"


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
        from servesweep.sweep.orchestrator import fake_gpu_dir, store_path_for

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
