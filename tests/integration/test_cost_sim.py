"""Cost as an objective, through a real sweep: the simulated engine on four fake GPUs,
configurations that hold 1, 2 or 4 GPUs (``--tensor-parallel-size`` refuses to start
on any other count) and decode at different speeds; ``best --json`` picks the cheapest
per million output tokens, and the fewest GPUs, among those that meet the TTFT limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sweep_helpers import kill_tagged, run_cli, write_sweep

from servesweep.sim.testing import free_port_block

pytestmark = pytest.mark.integration

# per request: 16 tokens x step + TTFT; cost = GPUs / throughput
_POINTS = [
    # 1 GPU, 20 ms steps: the cheapest per token (~570 ms a request), but a 250 ms TTFT
    {"tensor-parallel-size": 1, "step-ms": 20, "ttft-ms": 250},
    # 2 GPUs, 30 ms: ~490 ms a request, the cheapest that meets the limit
    {"tensor-parallel-size": 2, "step-ms": 30, "ttft-ms": 10},
    # 2 GPUs, 45 ms: slower on the same GPUs
    {"tensor-parallel-size": 2, "step-ms": 45, "ttft-ms": 10},
    # 4 GPUs, 25 ms: the fastest, the dearest
    {"tensor-parallel-size": 4, "step-ms": 25, "ttft-ms": 10},
    # 1 GPU, 80 ms: the fewest GPUs that meet the limit
    {"tensor-parallel-size": 1, "step-ms": 80, "ttft-ms": 10},
]


def _sweep(directory: Path) -> Path:
    return write_sweep(
        directory,
        name="priced",
        args={"load-time": 0.3},
        workloads=[
            {
                "name": "chat",
                "concurrency": [2],
                "requests": 8,
                "max_tokens": 16,
                "ignore_eos": True,
                "warmup": 0,
            }
        ],
        server_extra={
            "port": free_port_block(4),
            "gpus": [0, 1, 2, 3],
            "fake_gpus": {"count": 4, "memory": "80GiB"},
            "gpus_per_trial": "{param.tensor-parallel-size}",
        },
        extra={
            "params": {"points": _POINTS},
            "parallel": 1,
            "cost": {"gpu_hour": 2.49, "currency": "USD"},
            "objective": {"minimize": "chat.c2.cost_per_mtok"},
            "constraints": ["chat.c2.ttft_p99_ms < 200"],
        },
    )


def _by_tp_step(entry: dict[str, Any]) -> tuple[int, int]:
    params = entry["params"]
    return int(params["tensor-parallel-size"]), int(params["step-ms"])


def test_best_picks_the_cheapest_and_the_fewest_gpus_meeting_the_constraints(
    tmp_path: Path,
) -> None:
    sweep = _sweep(tmp_path)
    try:
        done = run_cli("run", str(sweep), "--quiet", timeout=420)
        assert done.returncode == 0, done.stdout + done.stderr
        cheapest = run_cli("best", str(sweep), "--json")
        assert cheapest.returncode == 0, cheapest.stdout + cheapest.stderr
        decision = json.loads(cheapest.stdout)
        assert decision["cost"] == {"gpu_hour": 2.49, "currency": "USD", "level": "chat.c2"}
        win = decision["best"]
        assert _by_tp_step(win) == (2, 30), decision["ranking"]
        assert win["gpus"] == 2
        # the figure is the price over the measured throughput, on the GPUs held
        throughput = run_cli(
            "best", str(sweep), "--json", "--objective", "chat.c2.output_throughput"
        )
        speeds = {
            _by_tp_step(c): c["values"]["chat.c2.output_throughput"]
            for c in json.loads(throughput.stdout)["ranking"]
        }
        assert win["cost_per_mtok"] == pytest.approx(2.49 * 2 / 3600 / speeds[(2, 30)] * 1e6)
        assert win["tokens_per_dollar"] == pytest.approx(speeds[(2, 30)] * 3600 / (2 * 2.49))
        # the cheaper 1-GPU configuration misses the TTFT limit
        excluded = {(e["label"], e["kind"]) for e in decision["excluded"]}
        assert any("ttft-ms=250" in label and kind == "constraint" for label, kind in excluded)
        ranked = [_by_tp_step(c) for c in decision["ranking"]]
        assert ranked[0] == (2, 30) and set(ranked) == {(2, 30), (2, 45), (4, 25), (1, 80)}
        # the fewest GPUs that meet the limit, then the cheapest per token among them
        fewest = run_cli(
            "best", str(sweep), "--json",
            "--objective", "gpus:min", "--objective", "chat.c2.cost_per_mtok:min",
        )  # fmt: skip
        assert fewest.returncode == 0, fewest.stderr
        chosen = json.loads(fewest.stdout)["best"]
        assert _by_tp_step(chosen) == (1, 80) and chosen["gpus"] == 1
        # without the limit, the faster 1-GPU configuration is the cheaper of the two
        loose = run_cli(
            "best", str(sweep), "--json", "--constraint", "chat.c2.error_rate == 0",
            "--objective", "gpus:min", "--objective", "chat.c2.cost_per_mtok:min",
        )  # fmt: skip
        assert _by_tp_step(json.loads(loose.stdout)["best"]) == (1, 20)
        # the text, the table and the HTML report say it too
        text = run_cli("best", str(sweep)).stdout
        assert "cost: 2 GPUs; at chat.c2" in text and "USD per million output tokens" in text
        table = run_cli("report", str(sweep), "--format", "markdown").stdout
        assert "cost\\_per\\_mtok" in table and "| gpus |" in table
        page = run_cli("report", str(sweep), "--format", "html").stdout
        assert "USD per million output tokens" in page and "cost_per_mtok" in page
    finally:
        kill_tagged("priced", tmp_path)
