"""``servesweep apply``: move the server to one configuration safely, leave it running.

The same gates as a sweep (stop the whole old instance, wait for its GPU memory,
refuse a foreign port owner, start, wait for a real generation), without
benchmarks, on the sweep's first slot (its port, the GPUs the configuration needs).
The instance is recorded in the store under the configuration's trial (added out of
plan when the sweep never had it), so a later ``servesweep run`` adopts it when a
pending trial has exactly its launch, and otherwise says that it stops it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servesweep.errors import ConfigError, TrialFailed
from servesweep.models import FailureClass, ServerConfig
from servesweep.spec.load import load_sweep
from servesweep.spec.slots import gpu_need, slot_port
from servesweep.store import Store, open_store
from servesweep.sweep.commands.run import (
    new_run_id,
    open_sweep,
    server_api_key,
    store_path_for,
    sweep_context,
    sweep_lock,
)
from servesweep.sweep.core.store_writer import StoreWriter
from servesweep.sweep.events import Event, NullObserver, Observer
from servesweep.sweep.slots.data import CurrentInstance, Placement, TrialOrder, this_node
from servesweep.sweep.slots.node import leftover_of, prepare_node
from servesweep.sweep.slots.worker import SlotWorker

__all__ = ["ApplyResult", "apply_config", "parse_sets"]


@dataclass(frozen=True)
class ApplyResult:
    ok: bool
    message: str
    trial_id: int | None = None
    failure_class: FailureClass | None = None


def parse_sets(sets: Sequence[str]) -> dict[str, Any]:
    """``["budget=8", "window=null"]`` -> ``{"budget": 8, "window": None}`` (YAML values)."""
    params: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"not key=value: {item!r}", key="--set")
        try:
            params[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            raise ConfigError(f"cannot read the value of {item!r}", key="--set") from None
    return params


def _chosen_params(
    store: Store, sweep_id: int, trial_id: int | None, params: Mapping[str, Any] | None, best: bool
) -> dict[str, Any]:
    if params is not None:
        return dict(params)
    if trial_id is not None:
        # --trial N: the trial's number within the sweep, as every report shows it
        trials = store.trials(sweep_id)
        for trial in trials:
            if trial.number == trial_id:
                return dict(trial.params)
        listed = ", ".join(str(t.number) for t in trials) or "none"
        raise ConfigError(f"no trial {trial_id} in this sweep (trials: {listed})", key="--trial")
    from servesweep.decide.best import find_best

    result = find_best(store.load_sweep_data(sweep_id, with_samples=False))
    if not result.feasible or result.winner is None:
        raise ConfigError(
            "--best: the sweep has no feasible configuration yet (see `servesweep best`)"
        )
    return dict(result.winner.trial.params)


class _Direct:
    """A channel that applies events at once (apply runs in one thread)."""

    def __init__(self, writer: StoreWriter) -> None:
        self._writer = writer

    def send(self, event: Event) -> None:
        self._writer.apply(event)


def _serve(worker: SlotWorker, order: TrialOrder) -> tuple[str, float]:
    """Move the slot of ``worker`` to the configuration of ``order`` and leave it running (no
    phases, no benchmark: ``servesweep apply``). Returns the served model and how
    long it took to become ready; raises TrialFailed like a trial's bring-up."""
    log_path = Path(order.log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    launch = worker.launch_of(order)
    current = worker.current
    if current is not None and current.instance.fingerprint == launch.fingerprint:
        info = worker.lifecycle.wait_ready(current.instance)
        return info.model, 0.0
    worker.stop_current()
    instance = worker.start_instance(order, launch, log_path)
    info = worker.lifecycle.wait_ready(instance)
    worker.current = CurrentInstance(order.trial, instance, info.model)
    return info.model, info.ready_s


def apply_config(
    sweep_file: str | Path,
    *,
    trial_id: int | None = None,
    params: Mapping[str, Any] | None = None,
    best: bool = False,
    store: Path | None = None,
    observer: Observer | None = None,
) -> ApplyResult:
    observer = observer or NullObserver()
    loaded = load_sweep(sweep_file)
    spec = loaded.spec
    need = gpu_need(spec)
    api_key = server_api_key(spec)  # the readiness gate sends it
    store_path = store_path_for(loaded, store)
    with sweep_lock(store_path), open_store(store_path) as db:
        sweep = open_sweep(loaded, db)
        chosen = _chosen_params(db, sweep.id, trial_id, params, best)
        config = ServerConfig.of(chosen)
        trial = db.ensure_trial(sweep.id, config)
        context = sweep_context(loaded, db, store_path, sweep, new_run_id(), api_key)
        channel = _Direct(StoreWriter(db, sweep.id, observer))
        node = this_node()
        gpus = tuple(spec.server.gpus[: need.of(chosen)]) if spec.server.gpus else ()
        placement = Placement(node, 0, gpus, slot_port(spec, 0))
        leftovers = [
            # apply runs on this one slot: only an instance of exactly its launch there
            # is kept
            leftover_of(context, live.id, live.instance, [placement], [(trial.id, chosen)])
            for live in db.live_instances()
            if live.instance is not None and live.instance.node in ("", node)
        ]
        label = config.label()
        log_path = (
            Path(context.log_root) / f"apply-trial-{trial.id}-{int(time.time())}" / "server.log"
        )
        order = TrialOrder(
            trial.id,
            trial.seq,
            trial.attempts,
            trial.fingerprint,
            chosen,
            str(log_path),
            number=trial.number,
        )
        try:
            # what earlier runs left on this machine is adopted (same launch) or stopped
            pool = Placement(node, 0, tuple(spec.server.gpus), slot_port(spec, 0))
            prepared = prepare_node(context, pool, leftovers, None, channel)
            current = None
            for left in prepared.adopted:
                current = CurrentInstance(left.trial, left.instance)
            worker = SlotWorker(
                context, placement, channel, current=current, baseline=prepared.baseline
            )
            try:
                model, ready_s = _serve(worker, order)
                running = worker.current
            finally:
                worker.close()
        except TrialFailed as failure:
            return ApplyResult(
                False,
                f"apply {label} failed: {failure.failure_class.value}: "
                f"{failure.evidence.summary()}",
                trial.id,
                failure.failure_class,
            )
        assert running is not None
        if current is not None and running.instance is current.instance:
            return ApplyResult(
                True,
                f"already running {label} (pid {running.instance.main_pid}, model {model}); "
                "verified that it generates",
                trial.id,
            )
        return ApplyResult(
            True,
            f"running {label} on {spec.server.host}:{placement.port} "
            f"(pid {running.instance.main_pid}, model {model}, ready after {ready_s:.1f}s); "
            f"log {log_path}",
            trial.id,
        )
