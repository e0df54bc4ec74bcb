"""Sweeps through a real systemd (the sandbox): a unit is given back as it was.

The unit runs the simulated engine on fake GPUs that live in the sandbox's scratch
folder (visible inside and out): 60 GiB of each 80 GiB GPU per instance, memory back
``release-delay`` seconds after a process exits.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from launcher_services import Sandbox, free_port, port_open
from tests.integration.sweep_helpers import (
    background_run,
    report_json,
    run_cli,
    wait_for_event,
)

from servesweep.fakegpu import FakeGpuDir
from servesweep.sim.testing import free_port_block
from servesweep.store import open_store

_UNIT = """\
[Unit]
Description=servesweep test: the user's own server
[Service]
Type=simple
KillMode=control-group
TimeoutStopSec=10
Restart=no
Environment=PYTHONUNBUFFERED=1
Environment=SERVESWEEP_FAKE_GPUS={gpus}
ExecStart={python} -m servesweep.sim --port {port} --gpus 0,1 --mem-per-gpu 60GiB \
--load-time 0.3 --release-delay {release}
"""


def _setup(sandbox: Sandbox, tmp_path: Path, name: str, release: float = 2.0) -> tuple[Path, str]:
    unit = f"{name}.service"
    gpus = sandbox.scratch / f"{name}-gpus"
    port = free_port()
    sandbox.write_unit(
        unit, _UNIT.format(gpus=gpus, python=sys.executable, port=port, release=release)
    )
    spec: dict[str, Any] = {
        "name": name,
        "store": "servesweep.db",
        "server": {
            "engine": "sim",
            "launcher": "systemd",
            "port": port,
            "gpus": [0, 1],
            "gpu_backend": "fake",
            "fake_gpu_dir": str(gpus),
            "fake_gpus": {"count": 2, "memory": "80GiB"},
            "args": {
                "mem-per-gpu": "60GiB",
                "load-time": 0.5,
                "release-delay": release,
                "ttft-ms": 10,
                "step-ms": 2,
            },
            "timeouts": {"stop": "10s", "release": "30s", "ready": "60s"},
            "systemd": {
                "unit": unit,
                "systemctl": [sandbox.systemctl],
                "journalctl": [sandbox.journalctl],
                "unit_dir": str(sandbox.unit_dir),
            },
        },
        "params": {"grid": {"budget": [2, 4, 8]}},
        "workloads": [
            {
                "name": "chat",
                "concurrency": [1],
                "requests": 6,
                "max_tokens": 16,
                "ignore_eos": True,
            }
        ],
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, unit


def _dropin(sandbox: Sandbox, unit: str) -> Path:
    return sandbox.unit_dir / f"{unit}.d" / "servesweep.conf"


def test_a_running_unit_is_stopped_its_memory_waited_for_and_started_again(
    systemd_sandbox: Sandbox, tmp_path: Path
) -> None:
    sweep_file, unit = _setup(systemd_sandbox, tmp_path, "sd-own")
    try:
        FakeGpuDir.create(systemd_sandbox.scratch / "sd-own-gpus", 2, 80 * 2**30)
        systemd_sandbox.sdctl("start", unit)
        port = yaml.safe_load(sweep_file.read_text())["server"]["port"]
        # the user's server is up and holds its GPU memory
        deadline = time.monotonic() + 60
        while not port_open(port):
            assert time.monotonic() < deadline, systemd_sandbox.show(unit, "ActiveState")
            time.sleep(0.1)
        done = run_cli("run", str(sweep_file), "--quiet", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = report_json(sweep_file)["trials"]
        # the first start came only after the user's server had released its memory
        assert [r["outcome"] for r in rows] == ["ok", "ok", "ok"], rows
        assert "stopping the running" in done.stderr
        assert not _dropin(systemd_sandbox, unit).exists()
        state = systemd_sandbox.show(unit, "ActiveState", "ExecStart")
        assert state["ActiveState"] in ("active", "activating"), state
        assert "--budget" not in state["ExecStart"], "it runs its own command again"
    finally:
        systemd_sandbox.remove_unit(unit)


def test_ctrl_c_gives_the_unit_back_and_an_immediate_rerun_waits_for_memory(
    systemd_sandbox: Sandbox, tmp_path: Path
) -> None:
    sweep_file, unit = _setup(systemd_sandbox, tmp_path, "sd-intr")
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(
                events,
                lambda e: e["event"] == "phase" and e.get("trial") == 2 and e["phase"] == "bench",
                timeout=180,
            )
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 130, out + err
        assert not _dropin(systemd_sandbox, unit).exists(), "no trial's flags left in place"
        assert systemd_sandbox.show(unit, "ActiveState")["ActiveState"] != "failed"
        rerun = run_cli("run", str(sweep_file), "--quiet", timeout=300)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert all(r["outcome"] == "ok" for r in report_json(sweep_file)["trials"])
    finally:
        systemd_sandbox.remove_unit(unit)


def test_a_failed_last_trial_does_not_leave_the_unit_failed(
    systemd_sandbox: Sandbox, tmp_path: Path
) -> None:
    sweep_file, unit = _setup(systemd_sandbox, tmp_path, "sd-fail", release=0.3)
    spec = yaml.safe_load(sweep_file.read_text())
    spec["params"] = {"points": [{"budget": 2}, {"crash-at-load": True}]}
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=300)
        assert done.returncode == 1, done.stdout + done.stderr
        rows = report_json(sweep_file)["trials"]
        assert [r["failure_class"] for r in rows] == [None, "start_crash"]
        state = systemd_sandbox.show(unit, "ActiveState")["ActiveState"]
        assert state == "inactive", state
        assert not _dropin(systemd_sandbox, unit).exists()
    finally:
        systemd_sandbox.remove_unit(unit)


def test_a_unit_template_gives_each_slot_its_own_unit(
    systemd_sandbox: Sandbox, tmp_path: Path
) -> None:
    sweep_file, _ = _setup(systemd_sandbox, tmp_path, "sd-slot")
    template = "sd-slot@.service"
    systemd_sandbox.write_unit(
        template,
        "[Service]\nType=simple\nKillMode=control-group\nRestart=no\n"
        f"ExecStart={sys.executable} -m servesweep.sim --port 9\n",
    )
    spec = yaml.safe_load(sweep_file.read_text())
    spec["server"]["systemd"]["unit"] = template
    spec["server"]["gpus_per_trial"] = 1
    spec["server"]["port"] = free_port_block(2)
    spec["server"]["args"]["mem-per-gpu"] = "60GiB"
    spec["params"] = {"grid": {"budget": [2, 4, 8, 16]}}
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = report_json(sweep_file)["trials"]
        assert all(r["outcome"] == "ok" for r in rows), rows
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            trials = store.trials(1)
        # each slot ran its trials through its own instance of the template
        units = {t.slot: {t.instance.unit for t in trials if t.instance} for t in trials}
        by_slot: dict[int | None, set[str | None]] = {}
        for trial in trials:
            assert trial.instance is not None
            by_slot.setdefault(trial.slot, set()).add(trial.instance.unit)
        assert by_slot == {0: {"sd-slot@0.service"}, 1: {"sd-slot@1.service"}}, units
        for slot in (0, 1):
            instance = f"sd-slot@{slot}.service"
            assert not (systemd_sandbox.unit_dir / f"{instance}.d" / "servesweep.conf").exists()
    finally:
        for slot in (0, 1):
            systemd_sandbox.sdctl("stop", f"sd-slot@{slot}.service", check=False)
        systemd_sandbox.remove_unit(template)
