"""The metric catalog against the real producers: the load generator against the
simulated engine (speculative decoding, fake GPUs, a closed and an open level) and a
one-trial sweep's phase times. Every sim is killed by PID; every run is bounded by a
request count."""

from __future__ import annotations

from pathlib import Path

from tests.integration.sweep_helpers import kill_tagged, run_cli, write_sweep

from servesweep import metrics_catalog as mc
from servesweep.bench.load import LoadOptions, run_workload_sync
from servesweep.bench.target import Target
from servesweep.decide.cost import level_cost
from servesweep.decide.refs import ResultIndex
from servesweep.fakegpu import FakeGpuDir
from servesweep.models import Phase
from servesweep.servers.gpu import open_probe
from servesweep.sim.testing import running_sim
from servesweep.spec.constraints import MetricRef
from servesweep.spec.schema import workload_spec
from servesweep.store import open_store

COUNTERS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
}


def test_a_level_produces_every_level_metric_of_the_catalog(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    FakeGpuDir.create(gpus, 1, 8 * 2**30)
    probe = open_probe("fake", str(gpus))
    sim_args = ["--load-time", "0", "--gpus", "0", "--mem-per-gpu", "1GiB"]
    sim_args += ["--ttft-ms", "5", "--step-ms", "5", "--budget", "8", "--topk", "4"]
    try:
        with running_sim(sim_args, tmp_path, fake_gpus=gpus) as run:
            run.wait_ready()
            target = Target(
                base_url=f"http://127.0.0.1:{run.port}",
                model="sim-model",
                spec_decode_counters=COUNTERS,
                timeout_s=60,
            )
            workload = workload_spec(
                name="w", concurrency=[2], requests=8, max_tokens=24, ignore_eos=True
            )
            closed = run_workload_sync(target, workload, LoadOptions(probe=probe, gpus=[0]))
            workload = workload_spec(name="w", rate=[50.0], requests=8, max_tokens=8)
            opened = run_workload_sync(target, workload, LoadOptions(probe=probe, gpus=[0]))
    finally:
        probe.close()
    produced = {name for result in (*closed, *opened) for name in result.metrics}
    # the cost of a level is derived from it when results are read (servesweep.decide.cost)
    for result in (*closed, *opened):
        priced, _ = level_cost(result.metrics, result.intervals, 1, 2.49)
        produced |= set(priced)
    assert produced == mc.LEVEL_METRICS, (
        f"not in the catalog: {sorted(produced - mc.LEVEL_METRICS)}; "
        f"in the catalog, never produced: {sorted(mc.LEVEL_METRICS - produced)}"
    )


def test_a_trial_records_the_seconds_of_every_timed_phase(tmp_path: Path) -> None:
    sweep = write_sweep(
        tmp_path,
        name="catalog",
        grid={"budget": [2]},
        workloads=[{"name": "chat", "concurrency": [1], "requests": 2, "max_tokens": 4}],
    )
    try:
        done = run_cli("run", str(sweep), "--quiet", timeout=120)
    finally:
        kill_tagged("catalog", tmp_path)
    assert done.returncode == 0, done.stderr
    with open_store(tmp_path / "servesweep.db", readonly=True) as store:
        sweep_record = store.latest_sweep("catalog")
        assert sweep_record is not None
        (trial,) = store.trials(sweep_record.id)
        data = store.load_sweep_data(sweep_record.id, with_samples=False)
    recorded = {mc.phase_metric(Phase(name)).name for name in trial.phase_seconds}
    # the GPUs the trial held are read from its record
    gpus = ResultIndex(data).stats(trial, MetricRef.of(None, None, mc.GPUS.name))
    assert gpus is not None and gpus.mean == len(trial.gpus) > 0
    recorded.add(mc.GPUS.name)
    assert recorded == mc.TRIAL_METRICS
