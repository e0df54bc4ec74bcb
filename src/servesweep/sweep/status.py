"""``servesweep status``: where a sweep stands, also while another process runs it.

Read-only: the results database is opened read-only and nothing is signalled. Besides
the trials (outcome, phase and time in it, where each ran), it lists the instances
the database records as running — those of a sweep in progress, or one that
``servesweep apply`` left running — and whether each still runs (checked on this
machine; an instance on another machine is shown as recorded).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from servesweep.errors import ConfigError, ServesweepError
from servesweep.servers.launchers import make_launcher
from servesweep.spec.load import load_sweep_text
from servesweep.store import SweepRecord, TrialRecord, open_store
from servesweep.sweep.slot import this_node

__all__ = ["format_status", "sweep_status"]


def sweep_status(path: Path, name: str | None) -> dict[str, Any]:
    """The status of the latest sweep named ``name`` (any when None) in ``path``."""
    with open_store(path, readonly=True) as store:
        sweep = store.latest_sweep(name)
        if sweep is None:
            raise ConfigError(f"no sweep{' named ' + repr(name) if name else ''} in {path}")
        trials = store.trials(sweep.id, in_plan_only=True)
        live = store.live_instances(sweep.id)
    now = time.time()
    rows = [_row(t, now) for t in trials]
    return {
        "sweep": sweep.name,
        "id": sweep.id,
        "store": str(path),
        "trials": rows,
        "instances": [_instance(sweep, t) for t in live],
    }


def _row(t: TrialRecord, now: float) -> dict[str, Any]:
    in_phase = None
    if t.outcome.value == "running" and t.phase is not None:
        started = t.phase_started.get(t.phase.value)
        in_phase = None if started is None else round(now - started, 1)
    return {
        "trial": t.id,
        "params": dict(t.params),
        "outcome": t.outcome.value,
        "phase": t.phase.value if t.phase else None,
        "seconds_in_phase": in_phase,
        "failure_class": t.failure_class.value if t.failure_class else None,
        "message": t.evidence.summary() if t.evidence else None,
        "attempts": t.attempts,
        "node": t.node or None,
        "slot": t.slot,
        "gpus": list(t.gpus),
    }


def _instance(sweep: SweepRecord, trial: TrialRecord) -> dict[str, Any]:
    instance = trial.instance
    assert instance is not None
    return {
        "trial": trial.id,
        "params": dict(trial.params),
        "node": instance.node or None,
        "pid": instance.main_pid,
        "port": instance.port,
        "gpus": list(instance.gpus),
        "unit": instance.unit,
        "container": instance.container_id,
        "running": _alive(sweep, trial),
        "adopted": trial.adopted,
    }


def _alive(sweep: SweepRecord, trial: TrialRecord) -> bool | None:
    """Whether the instance runs (None: it is on another machine, or cannot be told)."""
    instance = trial.instance
    if instance is None or instance.node not in ("", this_node()):
        return None
    try:
        spec = load_sweep_text(sweep.spec_text, sweep.spec_path).spec
        server = spec.server
        if instance.port is not None:
            server = server.model_copy(update={"port": instance.port})
        return make_launcher(server).alive(instance)
    except ServesweepError:
        return None


def format_status(status: dict[str, Any]) -> str:
    rows = status["trials"]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    lines = [
        f"sweep {status['sweep']} (#{status['id']}) in {status['store']}: "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    ]
    several = len({(r["node"], r["slot"]) for r in rows if r["slot"] is not None}) > 1
    for row in rows:
        params = " ".join(f"{k}={v}" for k, v in row["params"].items()) or "(defaults)"
        line = f"  {row['trial']:>4}  {row['outcome']:<11} {params}"
        if several and row["slot"] is not None:
            gpus = ",".join(str(g) for g in row["gpus"])
            line += f"  @{row['node']}/{row['slot']}" + (f" gpus {gpus}" if gpus else "")
        if row["outcome"] == "running":
            line += f"  [{row['phase']} {row['seconds_in_phase']}s]"
        if row["failure_class"]:
            line += f"  {row['failure_class']}: {row['message']}"
        lines.append(line)
    instances = status["instances"]
    if instances:
        lines.append("instances recorded as running:")
    for inst in instances:
        params = " ".join(f"{k}={v}" for k, v in inst["params"].items()) or "(defaults)"
        state = {True: "running", False: "gone", None: "not checked (another machine)"}[
            inst["running"]
        ]
        what = inst["unit"] or inst["container"] or f"pid {inst['pid']}"
        gpus = ",".join(str(g) for g in inst["gpus"])
        lines.append(
            f"  trial {inst['trial']} ({params}): {what} on {inst['node'] or 'this machine'} "
            f"port {inst['port']}" + (f" gpus {gpus}" if gpus else "") + f" — {state}"
        )
    if any(inst["running"] is not False for inst in instances):
        lines.append(f"  stop them: servesweep stop {status.get('sweep_file') or 'SWEEP_FILE'}")
    return "\n".join(lines)
