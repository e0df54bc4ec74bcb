"""``servesweep doctor``: what is on the GPUs, who owns the port, what the unit's
settings imply, and whether the engine really generates — as a JSON-able dict.

Nothing here raises for what it finds: a failing probe or endpoint is reported as
an ``error`` entry beside the facts that could be gathered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from servesweep.errors import ServesweepError
from servesweep.models import GpuHolder, ProcessInfo, short_cmdline
from servesweep.servers import ports, procs
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.ownership import STORE_ID_ENV, STORE_PATH_ENV, read_owner
from servesweep.servers.preflight import preflight
from servesweep.servers.readiness import HttpAnswer, count_tokens, first_model, http_call
from servesweep.servers.release import describe_holder
from servesweep.spec.schema import ServerSpec

__all__ = ["diagnose"]

_TIMEOUT = 5.0
_GEN_TIMEOUT = 30.0


def _holder(h: GpuHolder) -> dict[str, Any]:
    full = describe_holder(h)
    return {
        "pid": full.pid,
        "name": full.name,
        "used_bytes": full.used_bytes,
        "cmdline": short_cmdline(full.cmdline, 300),
        "servesweep_instance": procs.tag_of(full.pid),
    }


def _process(p: ProcessInfo) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "name": p.name,
        "state": p.state,
        "cmdline": short_cmdline(p.cmdline, 300),
        "servesweep_instance": procs.tag_of(p.pid) if p.pid > 0 else None,
    }


def _gpus(probe: GpuProbe, gpus: list[int] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": probe.name}
    try:
        out["environment"] = probe.describe()
        states = probe.snapshot(gpus)
    except ServesweepError as exc:
        out["error"] = str(exc)
        return out
    out["devices"] = [
        {
            "index": s.index,
            "name": s.name,
            "used_bytes": s.used_bytes,
            "total_bytes": s.total_bytes,
            "used": f"{s.used_bytes / 2**30:.1f} / {s.total_bytes / 2**30:.1f} GiB",
            "holders": [_holder(h) for h in s.holders],
        }
        for s in states
    ]
    return out


def _systemd(spec: ServerSpec) -> dict[str, Any]:
    assert spec.systemd is not None
    out: dict[str, Any] = {"unit": spec.systemd.unit}
    try:
        from servesweep.servers.launchers.systemd import SystemdLauncher, unit_warnings

        props = SystemdLauncher(spec).show()
    except ImportError as exc:
        out["error"] = f"the systemd launcher is not available: {exc}"
        return out
    except ServesweepError as exc:
        out["error"] = str(exc)
        return out
    for key in ("Type", "KillMode", "Restart", "ActiveState", "SubState", "MainPID"):
        if key in props:
            out[key] = props[key]
    out["implications"] = unit_warnings(spec.systemd.unit, props)
    return out


def _call(
    spec: ServerSpec,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = _TIMEOUT,
) -> tuple[dict[str, Any], HttpAnswer | None]:
    api_key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
    t0 = time.monotonic()
    answer = http_call(
        spec.host, spec.port, method, path, body=body, api_key=api_key, timeout=timeout
    )
    ms = round((time.monotonic() - t0) * 1000, 1)
    if isinstance(answer, str):
        return {"path": path, "error": answer, "ms": ms}, None
    return {"path": path, "status": answer.status, "ms": ms}, answer


def _engine(spec: ServerSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"engine": spec.engine, "url": f"http://{spec.host}:{spec.port}"}
    try:
        preset = get_preset(spec.engine)
    except ServesweepError as exc:
        out["error"] = str(exc)
        return out
    endpoints: dict[str, Any] = {}
    if preset.health_path:
        endpoints["health"], _ = _call(spec, "GET", preset.health_path)
    endpoints["models"], listing = _call(spec, "GET", preset.models_path)
    models: list[str] = []
    if listing is not None and listing.status == 200:
        data = listing.json()
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            models = [str(m.get("id")) for m in data["data"] if isinstance(m, dict)]
        endpoints["models"]["models"] = models
    if preset.metrics_path:
        endpoints["metrics"], _ = _call(spec, "GET", preset.metrics_path)
    out["endpoints"] = endpoints
    model = spec.served_model_name or (first_model(listing) if listing else None)
    if model is None:
        failed = endpoints["models"].get("error")
        why = (
            f"{preset.models_path} failed: {failed}"
            if failed
            else f"{preset.models_path} listed none"
        )
        out["generation"] = {
            "ok": False,
            "error": f"no model name (no served_model_name, and {why})",
        }
        return out
    body = {
        "model": model,
        "prompt": "Hello",
        "max_tokens": 4,
        "temperature": 0,
        **preset.request_extras,
    }
    gen, answer = _call(spec, "POST", "/v1/completions", body, _GEN_TIMEOUT)
    if answer is not None and answer.status == 404:
        chat = {k: v for k, v in body.items() if k != "prompt"}
        chat["messages"] = [{"role": "user", "content": "Hello"}]
        gen, answer = _call(spec, "POST", "/v1/chat/completions", chat, _GEN_TIMEOUT)
    tokens = count_tokens(answer) if answer is not None and answer.status == 200 else 0
    gen.update({"model": model, "tokens": tokens, "ok": tokens >= 1})
    if answer is not None and answer.status != 200:
        gen["body"] = answer.body[:300].decode(errors="replace")
    out["generation"] = gen
    return out


def memory_warnings(spec: ServerSpec, configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per configuration predicted not to fit (servers.memory)."""
    from servesweep.servers.memory import MemoryModel
    from servesweep.spec.slots import params_label

    model = MemoryModel(spec)
    out = []
    for params in configs or [{}]:
        predicted = model.predict(params)
        if predicted.verdict == "oom":
            out.append(
                f"{params_label(params)} is predicted not to fit: {predicted.reason} "
                f"({predicted.per_gpu_bytes / 2**30:.1f} GiB per device, capacity "
                f"{predicted.capacity / 2**30:.1f} GiB; servesweep plan shows the parts)"
            )
    return out


def _port_problem(spec: ServerSpec, listeners: Sequence[ProcessInfo], store_id: str) -> str | None:
    """A listener on the sweep's port that is not an instance of this sweep's results
    database (``store_id``) makes every start fail ``port_in_use``."""
    for info in listeners:
        owner = read_owner(info.pid) if info.pid > 0 else None
        if owner is not None and store_id and owner.get(STORE_ID_ENV) == store_id:
            continue  # left by `apply` or a dead run: the sweep adopts or stops it
        who = info.describe()
        if owner is not None:
            who += f" (a servesweep instance of {owner.get(STORE_PATH_ENV) or 'another sweep'})"
        return (
            f"server.port {spec.port} on {spec.host} is in use by {who}: every start would "
            "fail port_in_use; stop it, or choose another server.port"
        )
    return None


def diagnose(
    spec: ServerSpec | None,
    probe: GpuProbe,
    configs: Sequence[Mapping[str, Any]] = (),
    store_id: str = "",
) -> dict[str, Any]:
    """Facts about the GPUs, the server's port, its systemd unit and its endpoints;
    with a spec, ``problems`` (one line each) that would make the sweep of ``configs``
    (the trials' params) fail at once (:func:`servesweep.servers.preflight.preflight`),
    a listener on the port that is not an instance of the results database
    ``store_id`` among them."""
    report: dict[str, Any] = {
        "gpus": _gpus(probe, list(spec.gpus) if spec and spec.gpus else None),
        "servesweep_processes": [
            {
                "pid": pid,
                "instance": tag,
                "cmdline": short_cmdline(procs.describe(pid).cmdline, 300),
            }
            for pid, tag in sorted(procs.tagged().items())
        ],
    }
    if spec is None:
        return report
    checked = preflight(spec, configs)
    report["problems"] = checked.problems
    memory = memory_warnings(spec, configs)
    if memory:
        report["warnings"] = memory
    if checked.notes:
        report["notes"] = checked.notes
    if checked.engine:
        report["installed_engine"] = checked.engine
    listeners = ports.listeners(spec.host, spec.port)
    report["port"] = {
        "host": spec.host,
        "port": spec.port,
        "listeners": [_process(p) for p in listeners],
    }
    busy = _port_problem(spec, listeners, store_id)
    if busy:
        report["problems"].append(busy)
    if spec.launcher == "systemd" and spec.systemd is not None:
        report["systemd"] = _systemd(spec)
    if listeners:
        report["engine"] = _engine(spec)
    else:
        report["engine"] = {
            "engine": spec.engine,
            "url": f"http://{spec.host}:{spec.port}",
            "running": False,
            "note": "nothing listens on the port yet: normal before a sweep, which starts "
            "the server (endpoints and generation are checked when one runs)",
        }
    return report
