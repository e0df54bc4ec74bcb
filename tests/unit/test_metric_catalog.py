"""One list of metric names: what the producers store is what references accept.

The producers run on synthetic inputs (no processes); every name they produce must be
in the catalog, and every name of the catalog must be produced by some input. The
acceptance length and a real sweep's phase times are checked against a running
simulator in tests/integration/test_metric_catalog_sim.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from servesweep import metrics_catalog as mc
from servesweep.bench.client import RawResult
from servesweep.bench.evals.runner import _summarize
from servesweep.bench.evals.sandbox import Sandbox
from servesweep.bench.metrics import LevelContext, compute_level
from servesweep.bench.telemetry import summarize_gpu
from servesweep.decide.cost import level_cost
from servesweep.errors import ConfigError
from servesweep.metrics_catalog import Latency, Scope, Stat
from servesweep.models import EvalTaskResult, Phase
from servesweep.spec import SweepSpec, parse_metric_ref, validate_ref
from servesweep.spec.schema import EvalSpec

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000


def _streamed(index: int, sent_ms: float, chunk_ms: list[float], tokens: list[int]) -> RawResult:
    chunk_ns = [int(t * MS) for t in chunk_ms]
    return RawResult(
        index=index,
        sent_ns=int(sent_ms * MS),
        scheduled_ns=int(sent_ms * MS),
        ok=True,
        first_ns=chunk_ns[0],
        first_answer_ns=chunk_ns[0],
        end_ns=chunk_ns[-1],
        chunk_ns=chunk_ns,
        chunk_tokens=tokens,
        prompt_tokens=12,
        completion_tokens=sum(tokens),
    )


def _level_names() -> set[str]:
    """Every metric name the load generator's metrics code produces for a closed and an
    open level of streamed requests (a failure among them), plus the GPU telemetry."""
    raws = [_streamed(i, i * 5, [i * 5 + 20, i * 5 + 28, i * 5 + 36], [1, 3, 2]) for i in range(8)]
    raws.append(RawResult(index=8, sent_ns=0, error="http_500", message="boom", end_ns=3 * MS))
    closed = LevelContext(
        t0_ns=0, concurrency=2, steady=(5 * MS, 60 * MS), loop_lags_ns=[100_000, 300_000]
    )
    opened = LevelContext(t0_ns=0, rate=200.0, loop_lags_ns=[200_000])
    names: set[str] = set()
    for ctx in (closed, opened):
        metrics, _, _, _ = compute_level(raws, ctx)
        names |= set(metrics)
    gpu, _ = summarize_gpu([(0, 0, 1000.0, 50.0, 300.0), (1, 1, 2000.0, 70.0, 320.0)])
    # the cost of a level is derived from its output throughput when results are read
    cost, _ = level_cost(metrics, {}, 2, 2.49)
    return names | set(gpu) | set(cost)


def _eval_names() -> set[str]:
    results = (
        EvalTaskResult("t1", 0, "pass"),
        EvalTaskResult("t2", 0, "fail"),
        EvalTaskResult("t3", 0, "error", "connection reset"),
    )
    sandbox = Sandbox()
    try:
        result = _summarize(
            "coding", "builtin:coding", EvalSpec(suite="builtin:coding"), results, sandbox, 0, 1
        )
    finally:
        sandbox.close()
    return set(result.metrics)


def test_names_are_unique_within_a_scope_and_described() -> None:
    keys = [(m.scope, m.name) for m in mc.CATALOG]
    assert len(keys) == len(set(keys))
    for metric in mc.CATALOG:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", metric.name), metric
        assert metric.unit and metric.description, metric
        assert mc.lookup(metric.name, metric.scope) is metric


def test_latency_and_phase_names_are_formed_in_one_place() -> None:
    assert mc.latency(Latency.TTFT, Stat.P99).name == "ttft_p99_ms"
    assert mc.latency(Latency.CHUNK_GAP, Stat.MEDIAN).name == "chunk_gap_median_ms"
    assert len({mc.latency(k, s).name for k in Latency for s in Stat}) == 25
    assert mc.phase_metric(Phase.LOAD).name == "load_s"
    assert tuple(p for p in Phase if p is not Phase.DONE) == mc.TIMED_PHASES
    for phase in mc.TIMED_PHASES:
        assert mc.phase_of(mc.phase_metric(phase).name) is phase
    assert mc.phase_of("done_s") is None
    assert {f"{p.value}_s" for p in mc.TIMED_PHASES} | {mc.GPUS.name} == mc.TRIAL_METRICS


def test_the_load_generator_produces_exactly_the_level_catalog_but_acceptance() -> None:
    produced = _level_names()
    assert produced <= mc.LEVEL_METRICS, produced - mc.LEVEL_METRICS
    # acceptance_length is chosen by bench.load from engine counters or the chunk
    # estimate; the integration test checks it against the simulator
    assert mc.LEVEL_METRICS - produced == {mc.ACCEPTANCE_LENGTH.name}


def test_evals_produce_exactly_the_eval_catalog() -> None:
    assert _eval_names() == mc.EVAL_METRICS


def _spec() -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "t",
            "server": {"engine": "sim"},
            "workloads": [
                {"name": "chat", "concurrency": [1, 8]},
                {"name": "coding", "eval": {"suite": "builtin:coding"}},
            ],
        }
    )


def _accepts(texts: Iterable[str]) -> set[str]:
    spec = _spec()
    ok = set()
    for text in texts:
        try:
            validate_ref(parse_metric_ref(text), spec)
        except ConfigError:
            continue
        ok.add(text)
    return ok


def test_references_accept_every_catalog_name_in_its_scope_and_nothing_else() -> None:
    level = {f"chat.c8.{name}" for name in mc.LEVEL_METRICS}
    evals = {f"coding.{name}" for name in mc.EVAL_METRICS}
    trial = set(mc.TRIAL_METRICS)
    assert _accepts(level | evals | trial) == level | evals | trial
    # what the producers make is what references accept
    assert _accepts(f"chat.c1.{n}" for n in _level_names()) == {
        f"chat.c1.{n}" for n in _level_names()
    }
    assert _accepts(f"coding.{n}" for n in _eval_names()) == {f"coding.{n}" for n in _eval_names()}
    wrong_scope = {f"chat.c1.{n}" for n in mc.EVAL_METRICS - mc.LEVEL_METRICS}
    wrong_scope |= {f"coding.{n}" for n in mc.LEVEL_METRICS - mc.EVAL_METRICS}
    wrong_scope |= {"chat.c1.load_s", "ttft_p99_ms", "chat.c1.ttft_p95_ms", "done_s"}
    assert _accepts(wrong_scope) == set()


def test_sweep_file_docs_hold_the_generated_catalog() -> None:
    text = (ROOT / mc.DOCS_FILE).read_text(encoding="utf-8")
    assert mc.replace_docs_block(text) == text, (
        "docs/sweep-file.md's metric catalog is out of date: run "
        "`.venv/bin/python dev/metric-catalog-docs.py`"
    )


def _metric_rows(text: str) -> dict[str, str]:
    """``name -> unit`` from every Markdown table whose header is ``| metric | unit |``."""
    rows: dict[str, str] = {}
    in_table = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line else []
        if cells[:2] == ["metric", "unit"]:
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if in_table and not set(cells[0]) <= set("-"):
            for name in re.findall(r"`([a-z0-9_{}]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_metrics_docs_list_every_level_metric_with_its_unit() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    rows = _metric_rows(text)
    latencies = {mc.latency(k, s).name for k in Latency for s in Stat}
    for name, unit in rows.items():
        metric = mc.lookup(name, Scope.LEVEL)
        assert metric is not None, f"docs/metrics.md documents {name!r}, not in the catalog"
        assert metric.unit == unit, f"docs/metrics.md: {name} in {unit!r}, catalog {metric.unit!r}"
    assert set(rows) == mc.LEVEL_METRICS - latencies
    # the latency family: every kind has a row of its own, every statistic is named
    kinds = set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, re.MULTILINE))
    assert {k.value for k in Latency} <= kinds
    family = re.search(r"For each `m` in (.*?)over completed requests", text, re.DOTALL)
    assert family is not None
    for stat in Stat:
        assert f"{{m}}_{stat.value}_ms" in family.group(1)


def test_a_name_in_two_scopes_is_one_metric_per_scope() -> None:
    level, evals = mc.lookup("error_rate", Scope.LEVEL), mc.lookup("error_rate", Scope.EVAL)
    assert level is mc.ERROR_RATE and evals is mc.EVAL_ERROR_RATE
