"""The noise the performance prediction holds: what launches of one configuration vary,
learned from the sweep's own relaunches by the rule ``best`` decides with, and at
least the measured levels' own intervals."""

from __future__ import annotations

import pytest
from tests.unit.test_perf_prediction import DESIGN, _landscape

from servesweep.decide.perf import Measured, Prediction, Setting, predict
from servesweep.decide.perf.inputs import measured_of
from servesweep.decide.perf.predict import learned_noise
from servesweep.decide.uncertainty import learned_launch_sd
from servesweep.models import LevelResult, Outcome
from servesweep.records import TrialRecord

METRIC = "chat.c8.output_throughput"
OBJ = Setting(metrics=(METRIC,))
SEQS = (32, 64, 128, 256)
TOKENS = (2048, 4096, 8192, 16384)
GRID = [{"seqs": s, "tokens": t} for s in SEQS for t in TOKENS]


def _trial(number: int, params: dict[str, int]) -> TrialRecord:
    return TrialRecord(
        id=number,
        sweep_id=1,
        seq=number,
        fingerprint=f"f{number}",
        params=params,
        outcome=Outcome.OK,
    )


def _level(value: float, launch: int, interval: tuple[float, float] | None) -> LevelResult:
    return LevelResult(
        "chat",
        "c8",
        0,
        {"output_throughput": value},
        intervals={"output_throughput": interval} if interval else {},
        confidence=0.95 if interval else None,
        launch=launch,
    )


def _history(spread: float, interval: float = 0.0) -> list[tuple[TrialRecord, list[LevelResult]]]:
    """The design measured: the first four configurations in three launches each whose
    figures are the landscape's value times ``1 - spread``, 1 and ``1 + spread`` (their
    standard deviation ``spread`` of it: what relaunches vary); the others in one. Each
    level's own interval is ``± interval`` of its value (none for 0)."""
    out = []
    for number, params in enumerate(DESIGN, start=1):
        mean = _landscape(params["seqs"], params["tokens"])
        factors = (1 - spread, 1.0, 1 + spread) if number <= 4 and spread else (1.0,)
        levels = []
        for launch, factor in enumerate(factors):
            value = mean * factor
            bounds = (value * (1 - interval), value * (1 + interval)) if interval else None
            levels.append(_level(value, launch, bounds))
        out.append((_trial(number, params), levels))
    return out


def _half_widths(spread: float, interval: float = 0.0) -> list[tuple[str, float, float]]:
    """(basis, low side, high side) of every configuration's prediction, relative."""
    out = []
    for got in predict(OBJ, GRID, measured_of(_history(spread, interval))):
        p = got[METRIC]
        assert p.value is not None and p.low is not None and p.high is not None
        out.append((p.basis, (p.value - p.low) / p.value, (p.high - p.value) / p.value))
    return out


def test_relaunches_that_vary_by_ten_percent_give_intervals_at_least_that_wide() -> None:
    trials = measured_of(_history(0.10))
    learned = learned_noise(OBJ, trials)(METRIC)
    # the rule best decides with, on the same stats: one home
    stats = [t.stats[METRIC] for t in trials]
    assert learned == pytest.approx(learned_launch_sd(stats, OBJ.noise))
    assert learned > 0.07  # 8 degrees of freedom at 10 % against the prior's 4 at 2 %
    widths = _half_widths(0.10)
    assert {basis for basis, _, _ in widths} == {"measured", "empirical"}
    for basis, low, high in widths:
        assert low >= 0.10 and high >= 0.10, basis


def test_without_relaunches_the_noise_is_the_stated_one() -> None:
    trials = measured_of(_history(0.0))
    assert all(t.stats[METRIC].launches == 1 for t in trials)
    assert learned_noise(OBJ, trials)(METRIC) == OBJ.noise == 0.02
    stated = Setting(metrics=(METRIC,), noise=0.05)
    assert learned_noise(stated, trials)(METRIC) == 0.05
    for basis, low, high in _half_widths(0.0):
        assert low >= 2 * 0.02 - 1e-9 and high >= 2 * 0.02 - 1e-9
        if basis == "measured":  # a level without an interval: two of the stated noise
            assert low == pytest.approx(0.04) and high == pytest.approx(0.04)
    # the same means measured with 10 % between launches: every interval wider
    noisy = _half_widths(0.10)
    assert all(n[2] > q[2] for n, q in zip(noisy, _half_widths(0.0), strict=True))


def test_a_measured_configuration_holds_at_least_its_levels_own_interval() -> None:
    # one launch each, each level's own 95 % interval +-30 % of its value: far wider
    # than launches vary
    for basis, low, high in _half_widths(0.0, interval=0.30):
        if basis == "measured":
            assert low >= 0.30 and high >= 0.30


def test_the_noise_is_learned_from_this_sweeps_relaunches_as_best_learns_it() -> None:
    # earlier sweeps' trials start the prediction warm, but best decides on this sweep's
    # candidates, and so does the noise: relaunched there or not, the same model
    # predictions (a measured configuration holds its own launches' interval either way)
    def modelled(got: list[dict[str, Prediction]]) -> list[float | None]:
        return [
            b
            for g in got
            if g[METRIC].basis == "empirical"
            for b in (g[METRIC].low, g[METRIC].high)
        ]

    relaunched = modelled(predict(OBJ, GRID, [], earlier=measured_of(_history(0.10))))
    once = modelled(predict(OBJ, GRID, [], earlier=measured_of(_history(0.0))))
    assert len(relaunched) == 2 * (len(GRID) - len(DESIGN))
    assert relaunched == pytest.approx(once, rel=1e-9)
    assert relaunched != pytest.approx(modelled(predict(OBJ, GRID, measured_of(_history(0.10)))))


def test_a_measured_trial_without_stats_is_two_of_the_noise() -> None:
    bare = [Measured({"seqs": 32, "tokens": 2048}, {METRIC: 1000.0})]
    [got] = predict(OBJ, [{"seqs": 32, "tokens": 2048}], bare)
    assert (got[METRIC].low, got[METRIC].high) == pytest.approx((960.0, 1040.0))
