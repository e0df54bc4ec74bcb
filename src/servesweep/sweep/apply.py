"""``servesweep apply``: move the server to one configuration safely, leave it running.

The same gates as a sweep (stop the whole old instance, wait for its GPU memory,
refuse a foreign port owner, start, wait for a real generation), without
benchmarks. The instance is recorded in the store under the configuration's trial
(added out of plan when the sweep never had it), so a later ``servesweep run``
adopts it when its next trial has the same configuration instead of restarting it.
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
from servesweep.servers.engines import build_launch
from servesweep.spec.load import load_sweep
from servesweep.store import Store, open_store
from servesweep.sweep.events import NullObserver, Observer
from servesweep.sweep.orchestrator import (
    open_slot,
    open_sweep,
    prepare_slot,
    store_path_for,
    sweep_lock,
)
from servesweep.sweep.runner import TrialRunner

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
        trial = store.trial(trial_id)
        if trial.sweep_id != sweep_id:
            raise ConfigError(f"trial {trial_id} belongs to another sweep", key="--trial")
        return dict(trial.params)
    from servesweep.report import find_best

    result = find_best(store.load_sweep_data(sweep_id, with_samples=False))
    if not result.feasible or result.winner is None:
        raise ConfigError(
            "--best: the sweep has no feasible configuration yet (see `servesweep best`)"
        )
    return dict(result.winner.trial.params)


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
    store_path = store_path_for(loaded, store)
    with sweep_lock(store_path), open_store(store_path) as db:
        sweep = open_sweep(loaded, db)
        chosen = _chosen_params(db, sweep.id, trial_id, params, best)
        config = ServerConfig.of(chosen)
        trial = db.ensure_trial(sweep.id, config)
        slot = open_slot(loaded, store_path, sweep.id)
        lifecycle = slot.lifecycle
        runner = TrialRunner(
            store=db,
            sweep_id=sweep.id,
            sweep_name=spec.name,
            server=spec.server,
            preset=slot.preset,
            lifecycle=lifecycle,
            probe=slot.probe,
            workloads=(),
            log_root=slot.log_root,
            observer=observer,
            instance_env=slot.instance_env,
        )
        label = config.label()
        try:
            # what earlier runs left on this slot is adopted (same config) or stopped
            prepare_slot(db, sweep, runner, [trial], observer)
            if runner.current is not None:
                running = runner.current.instance
                info = lifecycle.wait_ready(running)
                return ApplyResult(
                    True,
                    f"already running {label} (pid {running.main_pid}, model {info.model}); "
                    "verified that it generates",
                    runner.current.trial_id,
                )
            log_path = slot.log_root / f"apply-trial-{trial.id}-{int(time.time())}" / "server.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            key = f"{spec.name}-{trial.id}"
            argv, env = build_launch(spec.server, chosen, trial=key, log=str(log_path))
            env = {**slot.instance_env, **env}
            instance = lifecycle.start(argv, env, log_path, key, config.fingerprint)
            db.set_instance(trial.id, instance, launch_command=lifecycle.launch_command(argv, env))
            info = lifecycle.wait_ready(instance)
        except TrialFailed as failure:
            return ApplyResult(
                False,
                f"apply {label} failed: {failure.failure_class.value}: "
                f"{failure.evidence.summary()}",
                trial.id,
                failure.failure_class,
            )
        finally:
            slot.probe.close()
        return ApplyResult(
            True,
            f"running {label} on {spec.server.host}:{spec.server.port} "
            f"(pid {instance.main_pid}, model {info.model}, ready after {info.ready_s:.1f}s); "
            f"log {log_path}",
            trial.id,
        )
