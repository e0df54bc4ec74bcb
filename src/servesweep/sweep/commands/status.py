"""``servesweep status``: where a sweep stands, also while another process runs it.

Read-only: the results database is opened read-only and nothing is signalled. Besides
the trials (outcome, phase and time in it, where each ran; those skipped as predicted
worse and then launched before the end, reopened, with the skip and its prediction:
``reopened`` events, :class:`~servesweep.records.ReopenedSkip`), it lists the instances
the database records as running — those of a sweep in progress, or one that
``servesweep apply`` left running — and whether each still runs (checked on this
machine; an instance on another machine is shown as recorded).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from servesweep.decide.mismatches import describe, trial_mismatches
from servesweep.decide.perf.gate import skipped_as
from servesweep.errors import ConfigError, ServesweepError
from servesweep.servers.launchers import make_launcher
from servesweep.servers.ownership import lock_holder
from servesweep.spec.load import load_sweep_text
from servesweep.spec.plan import KnownTrial
from servesweep.store import ReopenedSkip, Store, SweepRecord, TrialRecord, open_store
from servesweep.sweep.slots.data import this_node

__all__ = ["format_status", "known_trials", "sweep_status"]


def known_trials(store: Store, name: str) -> tuple[dict[str, KnownTrial], int]:
    """For ``servesweep plan``: the trials the latest sweep ``name`` already has (by
    fingerprint: number, outcome, final) and the number the next new trial gets."""
    sweep = store.latest_sweep(name)
    if sweep is None:
        return {}, 1
    known = {}
    for t in store.trials(sweep.id):
        outcome = t.outcome.value
        if t.failure_class is not None:
            outcome += f" {t.failure_class.value}"
        known[t.fingerprint] = KnownTrial(t.number, outcome, t.outcome.final)
    return known, len(known) + 1


def sweep_status(path: Path, name: str | None) -> dict[str, Any]:
    """The status of the latest sweep named ``name`` (any when None) in ``path``."""
    with open_store(path, readonly=True) as store:
        sweep = store.latest_sweep(name)
        if sweep is None:
            raise ConfigError(f"no sweep{' named ' + repr(name) if name else ''} in {path}")
        trials = store.trials(sweep.id, in_plan_only=True)
        removed = len(store.trials(sweep.id)) - len(trials)
        lost = {e["trial"]: e for e in store.events(sweep.id, "node_lost") if e.get("trial")}
        mismatched = tuple(store.events(sweep.id, "config_mismatch"))
        reopened = ReopenedSkip.by_trial(store.events(sweep.id, ReopenedSkip.kind))
        live = store.live_instances(sweep.id)
        others = []
        if name is None:
            for other in store.sweeps():
                planned = store.trials(other.id, in_plan_only=True)
                done = sum(1 for t in planned if t.outcome.final)
                others.append({"id": other.id, "name": other.name, "trials": len(planned),
                               "done": done})  # fmt: skip
    now = time.time()
    holder = lock_holder(str(path))
    rows = [_row(t, now, lost.get(t.id), holder is not None) for t in trials]
    for row, trial in zip(rows, trials, strict=True):
        row["config_mismatch"] = [describe(m) for m in trial_mismatches(mismatched, trial)]
        row["reopened"] = [skip.to_json() for skip in reopened.get(trial.id, ())]
    return {
        "sweep": sweep.name,
        "id": sweep.id,
        "store": str(path),
        "sweep_file": sweep.spec_path,
        "run_pid": holder,
        "trials": rows,
        "not_in_plan": removed,
        "reopened": [t.number for t in trials if t.id in reopened],
        "instances": [_instance(sweep, t) for t in live],
        "sweeps": others if len(others) > 1 else [],
    }


def _row(
    t: TrialRecord, now: float, lost: dict[str, Any] | None, run_alive: bool
) -> dict[str, Any]:
    in_phase = None
    if t.outcome.value == "running" and t.phase is not None:
        started = t.phase_started.get(t.phase.value)
        in_phase = None if started is None else round(now - started, 1)
    return {
        "run_alive": run_alive if t.outcome.value == "running" else None,
        "node_id": t.node_id or None,
        "retried_after": (
            f"node_lost on {lost.get('node') or '?'}" if lost and t.attempts > 1 else None
        ),
        "trial": t.number,
        "id": t.id,
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


def _skip_text(skip: Mapping[str, Any]) -> str:
    """``skipped 2026-12-07 07:50:03 UTC as predicted worse than #1 (metric 120):
    metric 40 [30-50] (speculative)``."""
    text = skipped_as(skip)  # the report's words
    cells = []
    for metric, p in skip["predicted"].items():
        if isinstance(p, Mapping) and p.get("value") is not None:
            cells.append(
                f"{metric} {p['value']:.4g} [{p['low']:.4g}-{p['high']:.4g}] ({p['basis']})"
            )
        else:
            cells.append(f"{metric} unknown")
    return text + (": " + "; ".join(cells) if cells else "")


def _instance(sweep: SweepRecord, trial: TrialRecord) -> dict[str, Any]:
    instance = trial.instance
    assert instance is not None
    return {
        "trial": trial.number,
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


def _on_this_machine(node: str) -> bool:
    """Whether a record's node names this machine: its hostname, or one of its own
    addresses (a cluster node started here, on a loopback or an interface address)."""
    if node in ("", this_node(), socket.getfqdn()):
        return True
    try:
        address = ipaddress.ip_address(node.split("#")[0])
    except ValueError:
        return False
    if address.is_loopback:
        return True
    ours = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(address) in ours


def _alive(sweep: SweepRecord, trial: TrialRecord) -> bool | None:
    """Whether the instance runs (None: it is on another machine, or cannot be told)."""
    instance = trial.instance
    if instance is None or not _on_this_machine(instance.node):
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
    lines: list[str] = []
    sweeps = status.get("sweeps") or []
    if sweeps:
        lines.append(f"{len(sweeps)} sweeps in {status['store']}:")
        for s in sweeps:
            lines.append(f"  #{s['id']}  {s['name']}: {s['done']}/{s['trials']} trials done")
        lines.append(
            f"showing the latest, {status['sweep']}; name its sweep file to see another "
            "(servesweep status FILE)"
        )
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    lines += [
        f"sweep {status['sweep']} (#{status['id']}) in {status['store']}: "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        + (
            f"; {status['not_in_plan']} more no longer in the sweep file"
            if status.get("not_in_plan")
            else ""
        )
    ]
    reopened = status.get("reopened") or []
    if reopened:
        lines.append(
            f"{len(reopened)} reopened: skipped as predicted worse, then launched before the "
            "end (their interval still reached the leader): " + ", ".join(f"#{n}" for n in reopened)
        )
    # where each trial ran: on a cluster always, on one machine when it had several slots
    several = len({(r["node"], r["slot"]) for r in rows if r["slot"] is not None}) > 1
    several = several or any(r.get("node_id") for r in rows)
    for row in rows:
        params = " ".join(f"{k}={v}" for k, v in row["params"].items()) or "(defaults)"
        line = f"  {row['trial']:>4}  {row['outcome']:<11} {params}"
        if several and row["slot"] is not None:
            gpus = ",".join(str(g) for g in row["gpus"])
            line += f"  @{row['node']}/{row['slot']}" + (f" gpus {gpus}" if gpus else "")
        if row["outcome"] == "running" and row.get("run_alive") is False:
            line += (
                f"  [was in {row['phase']}; the run that ran it has ended: run the same "
                "command again to continue]"
            )
        elif row["outcome"] == "running":
            line += f"  [{row['phase']} {row['seconds_in_phase']}s]"
        if row.get("retried_after"):
            line += f"  (attempt {row['attempts']}, run again after {row['retried_after']})"
        if row["failure_class"]:
            line += f"  {row['failure_class']}: {row['message']}"
        elif row["outcome"] == "skipped" and row["message"]:
            line += f"  {row['message']}"  # why not launched: the prediction
        if row.get("config_mismatch"):
            line += "  config_mismatch: " + "; ".join(row["config_mismatch"])
        then = "to launch before the end" if row["outcome"] == "pending" else "then launched"
        for skip in row.get("reopened") or ():
            line += f"  reopened: {_skip_text(skip)}; {then}"
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
