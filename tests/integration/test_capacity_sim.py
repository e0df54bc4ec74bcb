"""A capacity workload against the simulated engine, whose timing model (docs/sim.md)
gives the true capacity: in closed loop every request in flight slows each decode step,
``step = step_ms * (1 + batch_slowdown * (running - 1))``, so the highest concurrency
whose time per output token meets a TPOT SLO is known in advance.

The sim is started on a free loopback port and killed by PID (``running_sim``); each
level is bounded by its request count and the search by ``max_levels``."""

from __future__ import annotations

import math
from pathlib import Path

from servesweep.bench.capacity import CAPACITY_LEVEL
from servesweep.bench.load import run_workload_sync
from servesweep.bench.target import Target
from servesweep.sim.testing import running_sim
from servesweep.spec.schema import workload_spec

STEP_MS = 20.0
SLOWDOWN = 0.5
TPOT_SLO_MS = 115.0  # between the step at 10 running (110 ms) and at 11 (120 ms)


def true_capacity() -> int:
    """The highest concurrency whose decode step meets the SLO (docs/sim.md)."""
    return math.floor(1 + (TPOT_SLO_MS / STEP_MS - 1) / SLOWDOWN)


def test_capacity_of_the_simulated_engine_within_5_percent(tmp_path: Path) -> None:
    args = ["--load-time", "0", "--ttft-ms", "20", "--step-ms", str(STEP_MS)]
    args += ["--batch-slowdown", str(SLOWDOWN), "--max-num-seqs", "64"]
    workload = workload_spec(
        **{
            "name": "chat",
            "requests": 40,
            "max_tokens": 12,
            "ignore_eos": True,
            "capacity": {
                "slo": {"tpot_ms": TPOT_SLO_MS},
                "vary": "concurrency",
                "low": 1,
                "high": 32,
                "quantile": 0.9,
            },
        }
    )
    with running_sim(args, tmp_path) as sim:
        sim.wait_ready()
        target = Target(base_url=f"http://127.0.0.1:{sim.port}", model="sim-model", timeout_s=60)
        results = run_workload_sync(target, workload)
    summary = results[-1]
    assert summary.level == CAPACITY_LEVEL
    truth = true_capacity()
    assert truth == 10
    found = summary.metrics["capacity"]
    assert abs(found - truth) <= 0.05 * truth, summary.info
    assert summary.metrics["capacity_levels"] == len(results) - 1 <= 8
    assert summary.info["bound"] is None
    # every level tried is a stored level of its own, with its load and verdict
    tried = results[:-1]
    assert {r.level for r in tried} == {f"c{int(r.info['capacity']['load'])}" for r in tried}
    for result in tried:
        load = result.info["capacity"]["load"]
        assert result.info["capacity"]["meets_slo"] == (load <= truth), result.info["capacity"]
