"""The warm-up of a launch against a real engine: llama.cpp's CPU llama-server (built by
dev/install-llama-server.sh) on a random-weight GGUF, one configuration measured in
two launches with ``warmup: 0`` and with ``warmup: auto``.

A 2-core machine is noisy: the tests assert on the recorded mechanics (what each
level says about its warm-up, when it ran), not on speed ratios; the cold-start
figures themselves are bench/cold_start.py's (docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sweep_helpers import run_cli

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from helpers.llama_server import cached_llama_server, llama_server_sweep
from servesweep.models import LevelResult
from servesweep.sim.testing import free_port
from servesweep.store import open_store

pytestmark = pytest.mark.integration

SHAPE = TinyLlamaShape(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=512)
LAUNCHES = 2


@pytest.fixture(scope="module")
def llama_server() -> str:
    return cached_llama_server()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "llama.gguf", shape=SHAPE)


def _measure(
    tmp_path: Path, llama_server: str, model: Path, warmup: int | str
) -> tuple[Any, list[LevelResult]]:
    workload = {
        "name": "chat",
        "dataset": "builtin:chat",
        "concurrency": [1],
        "requests": 4,
        "max_tokens": 8,
        "ignore_eos": True,
        "repeats": 2,
        "launches": LAUNCHES,
        "warmup": warmup,
    }
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name=f"warm-{warmup}",
        binary=llama_server,
        model=model,
        port=free_port(),
        points=[{"parallel": 1, "ctx-size": 1024}],
        workloads=[workload],
    )
    done = run_cli("run", str(sweep), "--quiet", timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    with open_store(tmp_path / f"warm-{warmup}.db", readonly=True) as store:
        data = store.load_sweep_data(with_samples=False)
    (trial,) = data.trials
    results = sorted(data.results[trial.id], key=lambda r: (r.launch, r.repeat))
    assert [(r.launch, r.repeat) for r in results] == [
        (launch, repeat) for launch in range(LAUNCHES) for repeat in range(2)
    ]
    return trial, results


@pytest.mark.timeout(600)
def test_warmup_0_records_none(llama_server: str, model: Path, tmp_path: Path) -> None:
    _, results = _measure(tmp_path, llama_server, model, 0)
    for res in results:
        # every level says it was measured without a warm-up: the first is the cold one
        assert res.info["warmup"] == {"mode": "none", "requests": 0}, res.info.get("warmup")
        assert res.metrics["completed"] == 4 and res.metrics["failed"] == 0


@pytest.mark.timeout(600)
def test_auto_warms_each_launch_until_its_windows_agree(
    llama_server: str, model: Path, tmp_path: Path
) -> None:
    trial, results = _measure(tmp_path, llama_server, model, "auto")
    previous_end = trial.started_at
    assert previous_end is not None
    for launch in range(LAUNCHES):
        first, second = [r for r in results if r.launch == launch]
        warm = first.info["warmup"]
        assert warm["mode"] == "auto"
        windows = warm["windows"]
        # windows of max(4, 2 x concurrency) requests, all counted
        assert all(w["requests"] == 4 for w in windows)
        assert warm["requests"] == 4 * len(windows)
        assert 2 <= len(windows) <= 8
        if warm["stable"]:
            # it stopped at the first two windows in a row that agreed within their noise
            a, b = windows[-2], windows[-1]
            assert abs(a["tokens_per_s"] - b["tokens_per_s"]) <= 1.96 * math.hypot(a["se"], b["se"])
            for x, y in itertools.pairwise(windows[:-1]):
                if "tokens_per_s" in x and "tokens_per_s" in y:
                    assert abs(x["tokens_per_s"] - y["tokens_per_s"]) > 1.96 * math.hypot(
                        x["se"], y["se"]
                    )
        else:
            assert len(windows) == 8
            assert any("warm-up did not settle" in w for w in first.warnings)
        # the warm-up ran in this launch before its first level: the cold requests
        # went to it, not to the measurement
        assert warm["seconds"] > 0
        assert first.started_at - warm["seconds"] >= previous_end
        # only the launch's first level is preceded by it
        assert "warmup" not in second.info
        assert first.metrics["completed"] == 4 and second.metrics["completed"] == 4
        previous_end = second.started_at + second.duration_s
