"""A real engine swept end to end: llama.cpp (llama-cpp-python's server) on the CPU,
serving a tiny random-weight GGUF written at test time, through the full lifecycle —
with the subprocess launcher and with the systemd launcher against a real systemd."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from launcher_services import Sandbox
from tests.integration.sweep_helpers import report_json, run_cli

from helpers.gguf_model import write_tiny_gguf
from servesweep.sim.testing import free_port

pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] not installed")

ROOT = Path(__file__).parents[2]


def _check_sweep(sweep_file: Path, trials: int) -> list[dict[str, Any]]:
    data = report_json(sweep_file)
    rows: list[dict[str, Any]] = data["trials"]
    assert len(rows) == trials
    for row in rows:
        assert row["outcome"] == "ok", row["failure"]
        assert row["phase_seconds"]["load"] > 0
        by_level = {(r["workload"], r["level"]): r["metrics"] for r in row["results"]}
        assert set(by_level) >= {("chat", "c1"), ("completions", "c1")}
        for (workload, _level), m in by_level.items():
            assert m["completed"] == 8 and m["failed"] == 0, (workload, m)
            assert m["output_throughput"] > 0
            assert m["ttft_median_ms"] > 0
            assert m["e2e_median_ms"] >= m["ttft_median_ms"]
            # counts consistent with the server's usage: never more than max_tokens
            limit = 32 if workload == "chat" else 64
            assert 0 < m["completion_tokens_mean"] <= limit
    return rows


def test_llamacpp_sweep_subprocess(tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    text = (ROOT / "examples" / "llamacpp-cpu.yaml").read_text()
    text = re.sub(r"port: \d+", f"port: {free_port()}", text)
    sweep_file = tmp_path / "llamacpp.yaml"
    sweep_file.write_text(text)
    env_before = os.environ.get("SERVESWEEP_GGUF")
    os.environ["SERVESWEEP_GGUF"] = str(model)
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=600)
    finally:
        if env_before is None:
            os.environ.pop("SERVESWEEP_GGUF", None)
        else:
            os.environ["SERVESWEEP_GGUF"] = env_before
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _check_sweep(sweep_file, 8)
    assert {(r["params"]["n_threads"], r["params"]["n_ctx"]) for r in rows} == {
        (1, 512),
        (1, 1024),
        (2, 512),
        (2, 1024),
    }
    assert "best" in done.stdout
    table = run_cli("report", str(sweep_file))
    assert table.returncode == 0 and "n_threads" in table.stdout


UNIT = """\
[Unit]
Description=llama.cpp server swept by servesweep's tests

[Service]
Type=simple
KillMode=control-group
ExecStart={python} -m llama_cpp.server --model {model} --host 127.0.0.1 --port {port}
"""


def test_llamacpp_sweep_systemd(systemd_sandbox: Sandbox, tmp_path: Path) -> None:
    unit = "llama-sweep.service"
    model = write_tiny_gguf(systemd_sandbox.scratch / "tiny-sweep.gguf")
    port = free_port()
    systemd_sandbox.write_unit(unit, UNIT.format(python=sys.executable, model=model, port=port))
    spec = yaml.safe_load((ROOT / "examples" / "llamacpp-cpu.yaml").read_text())
    spec["name"] = "llamacpp-systemd"
    spec["server"].update(
        {
            "launcher": "systemd",
            "model": str(model),
            "port": port,
            "executable": [sys.executable, "-m", "llama_cpp.server"],
            "systemd": {
                "unit": unit,
                "systemctl": [systemd_sandbox.systemctl],
                "journalctl": [systemd_sandbox.journalctl],
                "unit_dir": str(systemd_sandbox.unit_dir),
            },
        }
    )
    # four configs are enough to prove the launcher; the subprocess test has all eight
    spec["params"] = {"grid": {"n_threads": [1, 2], "n_batch": [64, 256]}}
    sweep_file = tmp_path / "llamacpp-systemd.yaml"
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Type=simple" in done.stderr, "the user is told that active != ready"
        rows = _check_sweep(sweep_file, 4)
        invocations = {r["launch_command"] for r in rows}
        assert len(invocations) == 4
        state = systemd_sandbox.show(unit, "ActiveState")
        assert state["ActiveState"] in ("inactive", "failed"), "stopped at the end"
        dropin = systemd_sandbox.unit_dir / f"{unit}.d" / "servesweep.conf"
        assert not dropin.exists(), "the unit's own ExecStart is back"
    finally:
        systemd_sandbox.remove_unit(unit)
