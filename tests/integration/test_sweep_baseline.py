"""The incident, through resume: a sweep killed or interrupted while GPU memory is still
coming back must not take that memory for the GPUs' idle baseline when it is run
again (its release gate would then let the next server start into a full GPU).

The simulated engine on two fake 80 GiB GPUs takes 60 GiB of each, so two instances
never fit; memory comes back ``release-delay`` seconds after a process exits.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.sweep_helpers import (
    assert_measured_once,
    background_run,
    kill_tagged,
    run_cli,
    tagged_processes,
    wait_for_event,
    write_sweep,
)

from servesweep.sim.testing import free_port

REPO = Path(__file__).resolve().parents[2]

_SLOW_RELEASE = {"release-delay": 2.5, "load-time": 0.4}


def test_sigkill_during_the_release_wait_then_rerun_waits_for_the_memory(tmp_path: Path) -> None:
    sweep_file = write_sweep(
        tmp_path, name="relkill", grid={"budget": [2, 4, 8, 16]}, args=_SLOW_RELEASE
    )
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            # trial 2's release phase: trial 1's instance has exited, its memory is
            # still held for 2.5 s
            wait_for_event(
                events,
                lambda e: e["event"] == "phase" and e.get("trial") == 2 and e["phase"] == "release",
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        rerun = run_cli("run", str(sweep_file), "--quiet", timeout=240)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert_measured_once(sweep_file, 4)
        assert not tagged_processes("relkill", tmp_path)
    finally:
        kill_tagged("relkill", tmp_path)


def test_ctrl_c_then_immediate_rerun_waits_for_the_memory(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="intr", grid={"budget": [2, 4, 8]}, args=_SLOW_RELEASE)
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(
                events,
                lambda e: e["event"] == "phase" and e.get("trial") == 2 and e["phase"] == "bench",
            )
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            assert proc.returncode == 130
        # at once: the interrupted instance's memory is still coming back
        rerun = run_cli("run", str(sweep_file), "--quiet", timeout=240)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert_measured_once(sweep_file, 3)
        assert not tagged_processes("intr", tmp_path)
    finally:
        kill_tagged("intr", tmp_path)


_PHASES = ["stop", "release", "start", "load", "ready", "bench"]


@pytest.mark.parametrize("phase", _PHASES)
def test_sigkill_at_any_phase_then_plain_rerun(tmp_path: Path, phase: str) -> None:
    """SIGKILL at a random trial's ``phase``, then a plain rerun: every trial ok and
    measured once, nothing left running."""
    rng = random.Random(f"sigkill-{phase}")
    trial = rng.randint(2, 4)  # trials 2..4 have a stop and a release phase
    sweep_file = write_sweep(
        tmp_path,
        name=f"any-{phase}",
        grid={"budget": [2, 4, 8, 16]},
        args={"release-delay": 1.0, "load-time": 0.5, "shutdown-delay": 0.3},
    )
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(
                events,
                lambda e: e["event"] == "phase" and e.get("trial") == trial and e["phase"] == phase,
                timeout=120,
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        rerun = run_cli("run", str(sweep_file), "--quiet", timeout=240)
        assert rerun.returncode == 0, f"killed in trial {trial} {phase}: {rerun.stderr}"
        assert_measured_once(sweep_file, 4)
        assert not tagged_processes(f"any-{phase}", tmp_path)
    finally:
        kill_tagged(f"any-{phase}", tmp_path)


def _entered(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event["event"] == "phase" and event["phase"] == phase


def test_the_quickstart_killed_at_every_phase_in_turn_then_rerun_loses_nothing(
    tmp_path: Path,
) -> None:
    """examples/quickstart.yaml itself (on a free port, its files in the test's folder):
    SIGKILL once each lifecycle phase is entered, in turn, in a random order, each kill in a rerun
    of the killed run (whatever it left running adopted or stopped); then a plain
    rerun: all 7 trials ok, each measured once, nothing left running."""
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec["server"]["port"] = free_port()
    sweep_file = tmp_path / "quickstart.yaml"
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    order = list(_PHASES)
    random.Random("quickstart-kills").shuffle(order)
    try:
        for n, phase in enumerate(order):
            events = tmp_path / f"events-{n}.jsonl"
            with background_run(sweep_file, events=events) as proc:
                wait_for_event(events, _entered(phase), timeout=120)
                proc.send_signal(signal.SIGKILL)
                # killed mid-run, not after the sweep had ended
                assert proc.wait(timeout=10) == -signal.SIGKILL, (phase, proc.returncode)
        rerun = run_cli("run", str(sweep_file), "--quiet", timeout=300)
        assert rerun.returncode == 0, f"after kills at {order}: {rerun.stderr}"
        assert_measured_once(sweep_file, 7, (("chat", "c1", 0), ("chat", "c8", 0)))
        assert not tagged_processes("quickstart", tmp_path)
    finally:
        kill_tagged("quickstart", tmp_path)
