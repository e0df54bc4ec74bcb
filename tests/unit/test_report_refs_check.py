"""References given on the command line for a stored sweep are checked like those in
its sweep file: a misspelt name is a usage error (exit 2) with a suggestion, never a
configuration that no trial satisfies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from helpers.report_data import throughput_sweep
from servesweep.cli.main import main
from servesweep.decide.refs import check_constraint, check_ref
from servesweep.errors import ConfigError
from servesweep.models import LevelResult, Outcome, Phase, ServerConfig
from servesweep.records import SweepData
from servesweep.store import open_store

SPEC = """\
name: refs-demo
server: {engine: sim}
params:
  grid: {budget: [4, 8]}
workloads:
  - {name: chat, concurrency: [1, 8], requests: 8}
  - {name: single, concurrency: [4], requests: 8}
  - {name: coding, eval: {suite: builtin:coding}}
"""


def _with_spec(data: SweepData) -> SweepData:
    return replace(data, sweep=replace(data.sweep, spec_text=SPEC))


@pytest.mark.parametrize("with_spec", [True, False], ids=["sweep-file", "measured"])
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("chat.c1.bogus", ["unknown metric 'bogus'"]),
        ("chat.c1.ttft_p99", ["unknown metric 'ttft_p99'", "did you mean 'ttft_p99_ms'"]),
        ("chatt.c1.output_throughput", ["unknown workload 'chatt'", "did you mean 'chat'"]),
        ("chat.c4.output_throughput", ["no level 'c4'", "c1, c8"]),
        ("coding.ttft_p99_ms", ["'ttft_p99_ms' is not a metric of eval workload 'coding'"]),
        ("lod_s", ["unknown metric 'lod_s'", "did you mean 'load_s'"]),
        ("chat c1", ["not a metric reference"]),
    ],
)
def test_bad_references_are_config_errors_with_a_hint(
    text: str, words: list[str], with_spec: bool
) -> None:
    data = throughput_sweep()
    if with_spec:
        data = _with_spec(data)
    with pytest.raises(ConfigError) as exc:
        check_ref(data, text, key="--objective")
    assert exc.value.key == "--objective"
    for word in words:
        assert word in exc.value.message


def test_good_references_pass_and_complete_the_level() -> None:
    data = _with_spec(throughput_sweep())
    assert check_ref(data, "chat.c8.tpot_median_ms").key == "chat.c8.tpot_median_ms"
    assert check_ref(data, "coding.pass_rate").key == "coding.pass_rate"
    assert check_ref(data, "coding.error_rate").key == "coding.error_rate"
    assert check_ref(data, "load_s").key == "load_s"
    assert check_ref(data, "single.error_rate").key == "single.c4.error_rate"
    measured = throughput_sweep()  # no sweep file stored: what was measured decides
    assert check_ref(measured, "chat.c1.output_throughput").level == "c1"
    assert check_ref(measured, "coding.passed").key == "coding.passed"
    constraint = check_constraint(data, "chat.c1.ttft_p99_ms < 500", key="--constraint")
    assert constraint.value == 500 and constraint.ref.key == "chat.c1.ttft_p99_ms"
    with pytest.raises(ConfigError, match="did you mean 'ttft_p99_ms'") as exc:
        check_constraint(data, "chat.c1.ttft_p99 < 500", key="--constraint")
    assert exc.value.key == "--constraint"


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "servesweep.db"
    with open_store(path) as store:
        sweep = store.create_sweep("refs-demo", "demo.yaml", SPEC, "hash", "0.1.0")
        trials = store.sync_trials(sweep.id, [ServerConfig.of({"budget": b}) for b in (4, 8)])
        for n, record in enumerate(trials):
            store.begin_attempt(record.id, 100.0 * n, None)
            store.enter_phase(record.id, Phase.BENCH, 100.0 * n)
            for level in ("c1", "c8"):
                metrics = {"output_throughput": 100.0 + n, "ttft_p99_ms": 200.0}
                store.add_result(record.id, LevelResult("chat", level, 0, metrics))
            store.finish_trial(record.id, Outcome.OK, 100.0 * n + 10)
    return path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def test_best_refuses_a_misspelt_objective_or_constraint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(_store(tmp_path))
    code, out, err = _cli(capsys, "best", path, "--objective", "chat.c1.bogus")
    assert code == 2 and out == ""
    assert err.strip() == (
        "servesweep: --objective: 'chat.c1.bogus': unknown metric 'bogus' "
        "(see the metric catalog in docs/sweep-file.md)"
    )
    code, _, err = _cli(capsys, "best", path, "--objective", "chat.c1.output_thruput:min")
    assert code == 2 and "did you mean 'output_throughput'" in err
    code, _, err = _cli(capsys, "best", path, "--constraint", "chat.c2.ttft_p99_ms < 300")
    assert code == 2 and err.startswith("servesweep: --constraint: ") and "no level 'c2'" in err
    code, out, _ = _cli(capsys, "best", path, "--objective", "chat.c8.output_throughput")
    assert code == 0 and "budget=8" in out
