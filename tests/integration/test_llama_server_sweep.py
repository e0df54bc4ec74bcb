"""llama.cpp's own ``llama-server`` (built from source by dev/install-llama-server.sh)
swept end to end on the CPU, on a random-weight GGUF written at test time: with the
subprocess launcher and with the systemd launcher in the sandbox; and the load
generator against it (streamed chat at concurrency 1 and 2 must lose no request).

llama-server listens while it loads and answers ``/health`` with 503 until the model
is loaded; a poller records every answer, so each trial's readiness is checked
against what the server really said, not against servesweep's own account.
Weights are random: tests assert on mechanics (tokens, counts, phases), never text.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from launcher_services import Sandbox
from tests.integration.sweep_helpers import SERVESWEEP, report_json, run_cli

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from helpers.llama_server import HealthPoller, cached_llama_server, llama_server_sweep
from servesweep.sim.testing import free_port

# Large enough that loading takes a visible while (503s on /health), small enough to
# write in a second: 8 layers of 512 (about 85 MB of f32 weights).
SHAPE = TinyLlamaShape(n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1024)

# Four configurations: slots, context, batch sizes and flash attention all change.
# A slot's context (ctx-size / parallel) holds the longest builtin prompt (~320 tokens).
POINTS: list[dict[str, Any]] = [
    {"parallel": 1, "ctx-size": 1024, "batch-size": 512, "flash-attn": "off"},
    {"parallel": 2, "ctx-size": 2048, "batch-size": 256, "flash-attn": "on"},
    {"parallel": 4, "ctx-size": 4096, "batch-size": 128, "ubatch-size": 64, "flash-attn": "auto"},
    {"parallel": 2, "ctx-size": 4096, "batch-size": 64, "ubatch-size": 64, "flash-attn": "on"},
]


@pytest.fixture(scope="module")
def llama_server() -> str:
    return cached_llama_server()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "llama.gguf", shape=SHAPE)


def _check_trials(sweep_file: Path, poller: HealthPoller) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = report_json(sweep_file)["trials"]
    assert len(rows) == len(POINTS)
    for row in rows:
        assert row["outcome"] == "ok", row["failure"]
        started = row["phase_started"]
        # from the launch on: a launcher's start may return only after the model has
        # loaded (systemctl on a busy machine), so the 503s can fall in ``start``
        launched, ready_at = started["start"], started["bench"]
        # the poller saw this instance loading (503), and servesweep called it ready
        # only once it was not loading any more: no 503 from then on
        answers = poller.between(launched, ready_at)
        assert 503 in answers, (row["id"], answers[:20])
        after = poller.between(ready_at, started.get("done", ready_at + 1.0))
        assert after and all(s == 200 for s in after), (row["id"], after[:20])
        assert row["phase_seconds"]["load"] > 0
        by_level = {(r["workload"], r["level"]): r["metrics"] for r in row["results"]}
        assert set(by_level) == {("chat", "c1"), ("chat", "c2"), ("completions", "c1")}
        for (workload, level), m in by_level.items():
            assert m["completed"] == 4 and m["failed"] == 0, (row["id"], workload, level, m)
            assert m["output_throughput"] > 0 and m["ttft_median_ms"] > 0
            assert 0 < m["completion_tokens_mean"] <= 16
        # ignore_eos is honoured by llama-server: every completion is max_tokens long
        assert by_level[("completions", "c1")]["completion_tokens_mean"] == 16
    # each configuration really reached the server's command line
    for row, point in zip(rows, POINTS, strict=True):
        for key, value in point.items():
            assert f"--{key} {value}" in row["launch_command"], (key, row["launch_command"])
    return rows


@pytest.mark.timeout(1200)
def test_llama_server_sweep_subprocess(llama_server: str, model: Path, tmp_path: Path) -> None:
    port = free_port()
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name="llama-server-cpu",
        binary=llama_server,
        model=model,
        port=port,
        points=POINTS,
    )
    with HealthPoller(port) as poller:
        done = run_cli("run", str(sweep), "--quiet", timeout=1100)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _check_trials(sweep, poller)
    env = report_json(sweep)["sweep"]["environment"]
    assert env["engine_version"].startswith("llama-server "), env
    assert all(r["phase_seconds"]["release"] >= 0 for r in rows)


UNIT = """\
[Unit]
Description=llama-server swept by servesweep's tests

[Service]
Type=simple
KillMode=control-group
TimeoutStopSec=20
Restart=no
ExecStart={binary} -m {model} --host 127.0.0.1 --port {port}
"""


@pytest.mark.timeout(1500)
def test_llama_server_sweep_systemd(
    systemd_sandbox: Sandbox, llama_server: str, tmp_path: Path
) -> None:
    unit = "llama-server-sweep.service"
    # the binary and the model must be visible inside the sandbox: its scratch folder
    binary = systemd_sandbox.scratch / "llama-server"
    binary.write_bytes(Path(llama_server).read_bytes())
    binary.chmod(0o755)
    model = write_tiny_gguf(systemd_sandbox.scratch / "llama-sweep.gguf", shape=SHAPE)
    port = free_port()
    systemd_sandbox.write_unit(unit, UNIT.format(binary=binary, model=model, port=port))
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name="llama-server-systemd",
        binary=str(binary),
        model=model,
        port=port,
        points=POINTS,
        server_extra={
            "launcher": "systemd",
            "systemd": {
                "unit": unit,
                "systemctl": [systemd_sandbox.systemctl],
                "journalctl": [systemd_sandbox.journalctl],
                "unit_dir": str(systemd_sandbox.unit_dir),
            },
        },
    )
    try:
        with HealthPoller(port) as poller:
            done = run_cli("run", str(sweep), "--quiet", timeout=1100)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = _check_trials(sweep, poller)
        assert len({r["launch_command"] for r in rows}) == len(POINTS)
        state = systemd_sandbox.show(unit, "ActiveState")
        assert state["ActiveState"] in ("inactive", "failed"), "stopped at the end"
    finally:
        systemd_sandbox.remove_unit(unit)


@pytest.mark.timeout(600)
def test_streamed_chat_against_llama_server_loses_no_request(
    llama_server: str, model: Path, tmp_path: Path
) -> None:
    """The load generator against the real server: streamed chat, concurrency 1 and 2,
    8 requests each, every request completed (none lost to a reused connection)."""
    port = free_port()
    log = tmp_path / "server.log"
    argv = [llama_server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--parallel", "2", "--ctx-size", "2048", "--threads", "2", "--alias", "tiny"]
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        with HealthPoller(port, every=0.05) as poller:
            while not any(s == 200 for _, s in poller.samples):
                assert server.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "llama-server did not become healthy"
                time.sleep(0.05)
        done = subprocess.run(
            [
                *SERVESWEEP,
                *("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1,2"),
                *("--requests", "8", "--max-tokens", "16", "--endpoint", "chat", "--json"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        levels = {r["level"]: r["metrics"] for r in json.loads(done.stdout)}
        assert set(levels) == {"c1", "c2"}
        for level, m in levels.items():
            assert (m["completed"], m["failed"]) == (8, 0), (level, m)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


@pytest.mark.timeout(300)
def test_a_failed_start_quotes_llama_servers_first_error_line(
    llama_server: str, model: Path, tmp_path: Path
) -> None:
    """A flag value llama-server refuses while loading (a model given as a LoRA
    adapter): its log says why first and ``exiting due to model loading error`` last;
    the trial's evidence quotes both, the cause as the engine's first error line."""
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name="llama-server-bad",
        binary=llama_server,
        model=model,
        port=free_port(),
        points=[{"lora": str(model)}],
    )
    done = run_cli("run", str(sweep), timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr  # its only trial failed
    (row,) = report_json(sweep)["trials"]
    assert row["outcome"] == "failed" and row["failure_class"] == "start_crash", row
    failure = row["failure"]
    assert "failed to apply lora adapter" in failure["first_error_line"], failure
    assert "exiting due to model loading error" in failure["message"], failure
    # the one-line summary (the console's, the report's) quotes the cause too
    assert "the engine's first error line:" in failure["summary"]
    assert "failed to apply lora adapter" in failure["summary"]
    assert "failed to apply lora adapter" in done.stdout + done.stderr
