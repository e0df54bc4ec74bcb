"""A level's requests kept as columns give what one record per request gave: the same
records, the same intervals to the last bit (so the intervals' coverage is theirs,
``tests/unit/test_intervals.py``), through the store and a pickle; against the
statistics as they were computed from records (``tests.helpers.records_before``)."""

from __future__ import annotations

import io
import pickle
import random
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import records_before as before
from tests.helpers.raw_levels import random_level
from tests.helpers.samples import sequential_level

from servesweep.bench.capacity_search import slo_score
from servesweep.bench.client import RawResult
from servesweep.bench.columns import RawColumns, joined
from servesweep.bench.metrics import compute_columns, compute_level
from servesweep.decide.intervals import MAX_UNITS
from servesweep.decide.level_intervals import level_intervals
from servesweep.models import LevelResult, RequestSample, ServerConfig
from servesweep.samples import SampleColumns, columns_of
from servesweep.store import open_store

pytestmark = pytest.mark.unit


def _big(seed: int, copies: int) -> list[RawResult]:
    """A random level repeated (more requests than one bootstrap resamples)."""
    raws, _ = random_level(seed)
    return [
        replace(r, index=r.index + k * 1000, chunk_ns=list(r.chunk_ns))
        for k in range(copies)
        for r in raws
    ]


@pytest.mark.parametrize("seed", range(40))
def test_the_columns_are_the_records_they_were(seed: int) -> None:
    raws, ctx = random_level(seed)
    _, _, samples, _ = compute_level(raws, ctx)
    _, _, records, _ = before.compute_level(raws, ctx)
    assert isinstance(samples, SampleColumns)
    assert samples == records
    assert list(samples) == list(records)
    assert samples[1:3] == records[1:3]
    if records:
        assert samples[-1] == records[-1]
    assert columns_of(records) == records
    assert SampleColumns.from_bytes(samples.to_bytes()) == records
    assert pickle.loads(pickle.dumps(samples)) == records


@pytest.mark.parametrize(
    ("seed", "big"), [(seed, False) for seed in range(30)] + [(seed, True) for seed in range(6)]
)
def test_the_intervals_are_the_ones_records_gave(seed: int, big: bool) -> None:
    raws, ctx = random_level(seed)
    once = sum(1 for r in raws if r.ok and r.end_ns is not None)
    if big:
        raws = _big(seed, (MAX_UNITS + 200) // max(1, once) + 1)
    metrics, info, samples, _ = compute_level(raws, ctx)
    _, _, records, _ = before.compute_level(raws, ctx)
    acceptance = None
    if "acceptance_estimate_from_chunks" in info:
        source = "tokens_per_chunk_estimate" if seed % 2 else "engine_counters"
        acceptance = (info["acceptance_estimate_from_chunks"] * 1.1, source)
    slo = {"ttft_ms": 30.0, "tpot_ms": 3.0, "e2e_ms": 900.0} if seed % 3 == 0 else {}
    kw = {
        "duration_s": metrics["duration_s"],
        "slo": slo,
        "acceptance": acceptance,
        "values": metrics if seed % 2 else None,
    }
    new = level_intervals(samples, **kw)  # type: ignore[arg-type]
    assert new == before.level_intervals(records, **kw)  # type: ignore[arg-type]
    assert new == level_intervals(records, **kw)  # type: ignore[arg-type]
    done = sum(1 for s in records if s.ok and s.finished_at is not None)
    if big and once:
        assert done > MAX_UNITS  # the subsampled path


@pytest.mark.parametrize("seed", range(20))
def test_the_capacity_score_is_the_one_records_gave(seed: int) -> None:
    raws, ctx = random_level(seed)
    _, _, samples, _ = compute_level(raws, ctx)
    _, _, records, _ = before.compute_level(raws, ctx)
    for slo in (
        {"ttft_ms": 30.0},
        {"tpot_ms": 3.0, "e2e_ms": 900.0},
        {"ttft_ms": 9.0, "tpot_ms": 1.0},
    ):
        for quantile in (0.5, 0.9, 0.99):
            expected = before.slo_score(records, slo, quantile)
            assert slo_score(samples, slo, quantile) == expected
            assert slo_score(records, slo, quantile) == expected


def test_records_that_do_not_line_up_keep_their_intervals() -> None:
    """A record with more gaps than chunks after its first, or fewer: ITL pairs a gap
    with the tokens of the chunk it ended, as many as both have."""
    rng = random.Random(3)
    records = []
    for i in range(MAX_UNITS + 200):
        n = rng.choice([0, 1, 3])
        records.append(
            RequestSample(
                index=i,
                ok=True,
                sent_at=i * 0.01,
                first_token_at=i * 0.01 + 0.02,
                finished_at=i * 0.01 + 0.05,
                completion_tokens=None if i % 7 == 0 else 4,
                chunk_gaps=tuple(rng.uniform(0.001, 0.01) for _ in range(rng.choice([0, 2, 4]))),
                chunk_tokens=tuple(rng.choice([0, 1, 2]) for _ in range(n)),
            )
        )
    columns = columns_of(records)
    assert columns == records
    got = level_intervals(columns, duration_s=12.0)
    assert got == before.level_intervals(records, duration_s=12.0)
    assert "itl_p99_ms" in got


def test_worker_parts_join_as_the_requests_of_one_process() -> None:
    raws, ctx = random_level(5)
    whole = RawColumns()
    whole.extend(raws)
    parts = [RawColumns(), RawColumns(), RawColumns()]
    for k, part in enumerate(parts):
        part.extend(raws[k::3])
    ordered = raws[0::3] + raws[1::3] + raws[2::3]
    m, info, samples, warnings = compute_columns(joined(parts), ctx)
    m0, info0, samples0, warnings0 = before.compute_level(ordered, ctx)
    assert samples == samples0
    assert warnings == warnings0
    for name in ("completed", "failed", "ttft_p99_ms", "itl_p99_ms", "e2e_max_ms"):
        assert m.get(name) == m0.get(name)
    assert info["errors"] == info0["errors"]
    assert info["finish_reasons"] == info0["finish_reasons"]
    assert info["tokens_per_chunk_source"] == info0["tokens_per_chunk_source"]
    assert pickle.loads(pickle.dumps(whole)).arrays().sent.tolist() == [r.sent_ns for r in raws]


@pytest.mark.parametrize("seed", range(20))
def test_each_requests_tokens_are_summed_as_it_comes(seed: int) -> None:
    """The per-request token columns gathered during the level are those of its chunks,
    in one process and joined from several."""
    raws, _ = random_level(seed)
    parts = [RawColumns(), RawColumns()]
    for k, part in enumerate(parts):
        part.extend(raws[k::2])
    for columns in (*parts, joined(parts)):
        a = columns.arrays()
        runs = np.split(a.chunk_tokens, np.cumsum(a.chunk_count)[:-1]) if len(a.sent) else []
        assert a.token_sum.tolist() == [int(r.sum()) for r in runs]
        edges = [int(r[0] + r[-1]) if len(r) > 1 else int(r.sum()) for r in runs]
        assert a.edge_tokens.tolist() == edges
        assert columns.other_chunks == int((a.chunk_tokens != 1).sum())


def _store_level(tmp_path: Path, samples: object) -> tuple[Path, LevelResult]:
    path = tmp_path / "s.db"
    store = open_store(path)
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, [ServerConfig.of({"budget": 4})])
    store.begin_attempt(trial.id, 1.0, None)
    result = LevelResult("chat", "c8", 0, {"completed": 3.0}, samples)  # type: ignore[arg-type]
    store.add_result(trial.id, result)
    store.close()
    return path, result


def test_a_level_is_stored_as_one_blob_and_read_back_the_same(tmp_path: Path) -> None:
    raws, ctx = random_level(4)
    _, _, samples, _ = compute_level(raws, ctx)
    path, result = _store_level(tmp_path, samples)
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM sample_columns").fetchone() == (1,)
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == (0,)
    db.close()
    with open_store(path, readonly=True) as store:
        (got,) = store.results(1)
    assert isinstance(got.samples, SampleColumns)
    assert got.samples == samples
    assert got == result


def test_a_blob_larger_than_a_part_is_stored_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servesweep.store import schema

    monkeypatch.setattr(schema, "SAMPLE_PART", 1000)
    raws, ctx = random_level(4)
    _, _, samples, _ = compute_level(raws, ctx)
    path, _ = _store_level(tmp_path, samples)
    db = sqlite3.connect(path)
    (parts,) = db.execute("SELECT COUNT(*) FROM sample_columns").fetchone()
    assert parts == -(-len(samples.to_bytes()) // 1000) > 1
    db.close()
    with open_store(path) as store:
        (got,) = store.results(1)
    assert got.samples == samples


def test_a_level_stored_as_rows_is_read_as_it_was(tmp_path: Path) -> None:
    """A database of schema 5 (a row per request) is upgraded; its rows are read as
    records, in the order of their index, as before."""
    samples, _ = sequential_level(5, 3)
    path, _ = _store_level(tmp_path, ())
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE sample_columns; UPDATE meta SET value='5';")
    rows = [
        (1, s.index, 1, None, None, s.sent_at, s.first_token_at, s.finished_at, 100, 3, None,
         str(list(s.chunk_gaps)), str(list(s.chunk_tokens)))
        for s in reversed(samples)
    ]  # fmt: skip
    db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()
    with open_store(path, readonly=True) as store:  # not upgraded: no table of columns
        (got,) = store.results(1)
    assert got.samples == tuple(samples)
    with open_store(path) as store:
        (got,) = store.results(1)
        assert got.samples == tuple(samples)
        version = store._query("SELECT value FROM meta WHERE key='schema_version'")[0][0]
    assert version == "6"


def test_a_blob_that_is_not_columns_is_a_clear_error(tmp_path: Path) -> None:
    samples, _ = sequential_level(3, 2)
    path, _ = _store_level(tmp_path, tuple(samples))
    db = sqlite3.connect(path)
    db.execute("UPDATE sample_columns SET data=x'00010203'")
    db.commit()
    db.close()
    from servesweep.errors import StoreError

    with open_store(path) as store, pytest.raises(StoreError, match="cannot be read"):
        store.results(1)
    out = io.BytesIO()
    np.savez(out, indices=np.arange(3))  # columns missing
    db = sqlite3.connect(path)
    db.execute("UPDATE sample_columns SET data=?", (out.getvalue(),))
    db.commit()
    db.close()
    with open_store(path) as store, pytest.raises(StoreError, match="cannot be read"):
        store.results(1)
