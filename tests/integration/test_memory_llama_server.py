"""The memory prediction against the real llama-server (the CPU build): over
``ctx-size``, ``parallel``, batch and micro-batch sizes and the KV cache type, the
predicted weights and KV cache are each within 10 % of what llama-server's own buffer
report says (``model buffer size``, ``KV buffer size``, read from each trial's log);
each measured trial calibrates the predictions of the next ones, and the results keep
predicted against measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sweep_helpers import report_json, run_cli

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from helpers.llama_server import cached_llama_server, llama_server_sweep
from servesweep.sim.testing import free_port

# 8 layers of 512, 4 KV heads of 64: 16 KiB of f16 KV cache per token of context
SHAPE = TinyLlamaShape(n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1024)
POINTS: list[dict[str, Any]] = [
    {"ctx-size": 1024, "parallel": 1, "batch-size": 512},
    {"ctx-size": 4096, "parallel": 4, "batch-size": 256, "ubatch-size": 128},
    {"ctx-size": 2048, "parallel": 2, "batch-size": 64, "ubatch-size": 64},
    {"ctx-size": 8192, "parallel": 2, "batch-size": 128, "cache-type-k": "q8_0"},
]
TOLERANCE = 0.10


@pytest.fixture(scope="module")
def llama_server() -> str:
    return cached_llama_server()


def test_weights_and_kv_cache_within_10_percent_of_llama_server(
    tmp_path: Path, llama_server: str
) -> None:
    model = write_tiny_gguf(tmp_path / "llama.gguf", shape=SHAPE)
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name="memory",
        binary=llama_server,
        model=model,
        port=free_port(),
        points=POINTS,
        workloads=[{"name": "chat", "concurrency": [1], "requests": 1, "max_tokens": 4}],
        # llama-server prints its buffer sizes at -lv 4
        server_extra={
            "args": {"threads": 2, "n-gpu-layers": 0, "alias": "tiny", "log-verbosity": 4}
        },
    )
    planned = run_cli("plan", str(sweep), "--json")
    assert planned.returncode == 0, planned.stderr
    before = [t["predicted_memory"] for t in json.loads(planned.stdout)["trials"]]
    done = run_cli("run", str(sweep), "--quiet", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = report_json(sweep)["trials"]
    assert len(rows) == len(POINTS)
    for index, (row, plan) in enumerate(zip(rows, before, strict=True)):
        memory = row["memory"]
        predicted, measured = memory["predicted"], memory["measured"]
        assert plan["device"] == "host" and measured["device"] == "CPU", memory
        assert plan["verdict"] == "fits"
        for part in ("weights", "kv_cache"):
            # the prediction before any trial ran (plan), and the calibrated one
            for got in (plan[part], predicted[part]):
                error = abs(got - measured[part]) / measured[part]
                assert error <= TOLERANCE, (row["params"], part, got, measured[part])
        # every trial after the first was predicted with the earlier ones' figures
        assert predicted["calibrated"] == index, memory
    # the KV cache follows ctx-size and the cache type as llama-server allocates it
    kv = [row["memory"]["measured"]["kv_cache"] for row in rows]
    assert kv[1] == 4 * kv[0] and kv[2] == 2 * kv[0]
    assert kv[3] < 8 * kv[0]  # q8_0 keys
