"""The seed incident: the naive restart-sleep-poll sweep gets valid configs wrong."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from servesweep.sim.testing import free_port, read_truth

SCRIPT = Path(__file__).parents[2] / "examples" / "seed-race" / "naive_sweep.sh"


def test_naive_sweep_gets_valid_configs_wrong(tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        PORT=str(free_port()),
        WORK=str(tmp_path),
        SERVESWEEP_SIM_TRUTH=str(truth),
    )
    env.pop("SERVESWEEP_FAKE_GPUS", None)
    proc = subprocess.Popen(
        ["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        # Every engine the script started, by PID (they are our grandchildren).
        for event in read_truth(truth):
            if event["event"] == "process_start":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(event["pid"]), signal.SIGKILL)
    text = out.decode()
    started = dict(re.findall(r"config (budget=\S+ topk=\S+ window=\S+): started pid (\d+)", text))
    assert len(started) == 4, text
    failed = set(re.findall(r"config (budget=\S+ topk=\S+ window=\S+): failed to start", text))
    answered = dict(
        re.findall(r"config (budget=\S+ topk=\S+ window=\S+): benchmark .* answered by (\d+)", text)
    )
    wrong_server = {cfg for cfg, pid in answered.items() if pid != started[cfg]}
    # The naive script got at least one valid configuration wrong...
    assert failed | wrong_server, text
    # ...and the ground truth says why: each "failed" engine was either still loading
    # (it became ready later, or was killed while loading) or died of CUDA OOM
    # because the previous instance still held the GPU memory.
    events = read_truth(truth)
    for cfg in failed:
        pid = int(started[cfg])
        mine = [e["event"] for e in events if e["pid"] == pid]
        log = (tmp_path / f"server-{cfg_suffix(cfg)}.log").read_text()
        oom = "torch.OutOfMemoryError: CUDA out of memory" in log
        assert oom or "memory_allocated" in mine, (cfg, mine, log[-2000:])
    for cfg in wrong_server:
        # The benchmark reached the previous configuration's process.
        assert answered[cfg] in started.values(), text


def cfg_suffix(cfg: str) -> str:
    values = dict(part.split("=") for part in cfg.split())
    return f"{values['budget']}-{values['topk']}-{values['window']}"
