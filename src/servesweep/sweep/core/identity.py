"""What defines a measurement, so that a resumed sweep never mixes configurations.

A trial is keyed by its swept params, but what it measured also depends on the rest
of the sweep file: the engine, its executable, the model, the fixed args and the
environment, how it is launched, and each workload's definition. When a sweep file
is edited between two runs of the same sweep, :func:`changes` names every such
difference; results measured under the old settings are not silently taken for the
new ones (see ``orchestrator.open_sweep``).

Settings that change how servesweep waits or where it writes (timeouts, release
tolerance, ports, log and store paths, GPU backend, slots) do not change what is
measured and are left out. Environment values are compared, never shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servesweep.models import fingerprint
from servesweep.spec.schema import SweepSpec, WorkloadSpec

__all__ = ["changes", "server_identity", "workload_identity"]

_SERVER_KEYS = ("engine", "executable", "model", "served_model_name", "args", "command", "launcher")
_WORKLOAD_IGNORED = frozenset({"name", "workers"})


def server_identity(spec: SweepSpec) -> dict[str, Any]:
    """The server settings that define what a trial measures."""
    server = spec.server
    data: dict[str, Any] = {key: getattr(server, key) for key in _SERVER_KEYS}
    data["env"] = {k: fingerprint({"v": v}) for k, v in sorted(server.env.items())}
    data["gpus_per_trial"] = server.gpus_per_trial or len(server.gpus)
    if server.systemd is not None:
        data["systemd"] = {"unit": server.systemd.unit, "mode": server.systemd.mode}
    if server.docker is not None:
        dk = server.docker
        data["docker"] = {
            "image": dk.image,
            "run_args": dk.run_args,
            "network": dk.network,
            "gpus_flag": dk.gpus_flag,
        }
    if server.commands is not None:
        data["commands"] = {"start": server.commands.start}
    return data


def workload_identity(workload: WorkloadSpec) -> dict[str, Any]:
    """A workload's definition: what its results mean."""
    dumped = workload.model_dump(mode="json")
    return {k: v for k, v in dumped.items() if k not in _WORKLOAD_IGNORED}


def changes(old: SweepSpec, new: SweepSpec) -> list[str]:
    """What differs between two versions of a sweep file that changes what a trial
    measures, one short phrase each (``server.args (tp-size: 8 -> 4)``)."""
    out: list[str] = []
    if old.executor.bench_from != new.executor.bench_from:
        # from another node, every latency includes the network
        out.append(f"executor.bench_from ({old.executor.bench_from} -> {new.executor.bench_from})")
    a, b = server_identity(old), server_identity(new)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            out.append(f"server.{key}{_detail(key, a.get(key), b.get(key))}")
    old_w = {w.name: workload_identity(w) for w in old.workloads}
    for w in new.workloads:
        before = old_w.get(w.name)
        if before is not None and before != workload_identity(w):
            fields = sorted(
                k
                for k in set(before) | set(workload_identity(w))
                if before.get(k) != workload_identity(w).get(k)
            )
            out.append(f"workload {w.name!r} ({', '.join(fields)})")
    return out


def _detail(key: str, old: Any, new: Any) -> str:
    if key == "env" and isinstance(old, Mapping) and isinstance(new, Mapping):
        names = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        return f" ({', '.join(names)})"
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        diffs = [
            f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
            for k in sorted(set(old) | set(new), key=str)
            if old.get(k) != new.get(k)
        ]
        return f" ({'; '.join(diffs)[:200]})"
    return f" ({old!r} -> {new!r})"[:200]
