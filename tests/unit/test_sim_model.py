"""Pure parts of the simulated engine: sizes, tokenizer, speculation model, oracle, flags."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest

from servesweep.fakegpu.units import format_bytes, parse_size
from servesweep.sim.config import parse_args
from servesweep.sim.oracle import Oracle, OracleTask, load_tasks, oracle_correct
from servesweep.sim.specdecode import SpecModel
from servesweep.sim.tokenizer import chat_prompt_text, count_tokens, split_pieces, token_ids


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1GiB", 2**30),
        ("512MiB", 512 * 2**20),
        ("2gb", 2 * 10**9),
        ("4096", 4096),
        ("1.5GiB", 3 * 2**29),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "1 parsec", "-1GiB", "GiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_format_bytes_like_pytorch() -> None:
    assert format_bytes(2 * 2**30) == "2.00 GiB"
    assert format_bytes(324 * 2**20) == "324.00 MiB"
    assert format_bytes(0) == "0 bytes"


def test_tokenizer() -> None:
    assert count_tokens("Hello, world!") == 4
    assert token_ids("a a") == token_ids("a") * 2
    text = "def f(x):\n    return x  \n"
    pieces = split_pieces(text)
    assert "".join(pieces) == text
    assert len(pieces) == count_tokens(text)
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat_prompt_text(messages) == "user: hi"


def test_spec_off_is_plain_decoding() -> None:
    off = SpecModel()
    assert off.step_factor == 1.0 and off.expected_tokens_per_step == 1.0
    assert off.sample_step(random.Random(0)) == 0


def _throughput(budget: int, topk: int, window: int) -> float:
    m = SpecModel(budget, topk, window)
    return m.expected_tokens_per_step / m.step_factor


def test_spec_sweep_has_an_interior_optimum() -> None:
    grid = list(itertools.product(range(1, 41), range(1, 11), (256, 512, 1024, 2048, 4096, 0)))
    best = max(grid, key=lambda p: _throughput(*p))
    budget, topk, window = best
    assert 1 < budget < 40 and 1 < topk < 10 and window not in (256, 0)
    assert _throughput(*best) > 1.5  # speculation is worth it at the optimum
    # Each knob alone, the others at the optimum: worse on both sides.
    assert _throughput(budget - 4, topk, window) < _throughput(*best)
    assert _throughput(budget + 8, topk, window) < _throughput(*best)
    assert _throughput(budget, topk + 2, window) < _throughput(*best)
    assert _throughput(budget, topk - 1, window) < _throughput(*best)


def test_spec_sampling_matches_expectation() -> None:
    m = SpecModel(12, 3, 2048)
    rng = random.Random(5)
    mean = sum(1 + m.sample_step(rng) for _ in range(20000)) / 20000
    assert mean == pytest.approx(m.expected_tokens_per_step, rel=0.03)
    assert all(m.sample_step(rng) <= 4 for _ in range(1000))


def test_oracle_correct_is_a_pure_rate() -> None:
    hits = [oracle_correct(3, f"task/{i}", s, 0.3) for i in range(200) for s in range(5)]
    assert 0.25 < sum(hits) / len(hits) < 0.35
    assert hits == [oracle_correct(3, f"task/{i}", s, 0.3) for i in range(200) for s in range(5)]
    assert oracle_correct(3, "x", 0, 1.0) and not oracle_correct(3, "x", 0, 0.0)
    assert any(oracle_correct(4, f"task/{i}", 0, 0.3) != hits[i * 5] for i in range(200))


def test_oracle_matches_and_counts_samples(tmp_path: Path) -> None:
    f = tmp_path / "coding.jsonl"
    rows = [
        {
            "task_id": "a",
            "prompt": "def a():\n",
            "entry_point": "a",
            "reference": "def a():\n    return 1\n",
        },
        {"task_id": "b", "prompt": "no reference"},
        "not an object",
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    tasks = load_tasks(f)
    assert [t.task_id for t in tasks] == ["a"] and tasks[0].coding
    oracle = Oracle(tasks, seed=1, rate=1.0)
    answer = oracle.respond("please write def a():\n  thanks")
    assert answer is not None and answer[0] == "```python\ndef a():\n    return 1\n```"
    oracle.respond("def a():")
    assert oracle.asked == {"a": 2}
    assert oracle.respond("something else") is None
    wrong = OracleTask("t", "p", "Paris", coding=False).answer(False)
    assert "Paris" not in wrong


def test_flags_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("SERVESWEEP_FAKE_GPUS", "/tmp/gpus")
    monkeypatch.setenv("SERVESWEEP_SIM_TRUTH", "/tmp/truth")
    cfg = parse_args([])
    assert cfg.gpus == (2, 3) and cfg.fake_gpus == "/tmp/gpus" and cfg.truth == "/tmp/truth"
    assert cfg.port == 8000 and cfg.host == "127.0.0.1" and cfg.model == "sim-model"
    assert cfg.mem_per_gpu == 2**30
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    cfg = parse_args(["--gpus", "0,1", "--mem-per-gpu", "2GiB", "--budget", "8"])
    assert cfg.gpus == (0, 1) and cfg.mem_per_gpu == 2 * 2**30 and cfg.budget == 8
    assert parse_args([]).gpus == (0,)


@pytest.mark.parametrize(
    "argv",
    [["--bogus"], ["--error-rate", "2"], ["--topk", "0"], ["--load-time", "-1"], ["--gpus", "a"]],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_main_returns_2_on_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from servesweep.sim import main

    assert main(["--no-such-flag"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def _chunks(seed: int, index: int) -> list[list[str]]:
    import asyncio

    from servesweep.sim.engine import Engine

    cfg = parse_args(["--seed", str(seed), "--budget", "12", "--topk", "3", "--step-ms", "0"])
    cfg = dataclasses.replace(cfg, ttft_ms=0.0)
    engine = Engine(cfg, Oracle([], seed, 1.0))
    got: list[list[str]] = []

    async def emit(chunk: list[str]) -> None:
        got.append(chunk)

    plan = engine.plan("same prompt", 200, True, index)
    asyncio.run(engine.run(plan, emit))
    assert sum(len(c) for c in got) == 200
    return got


def test_generation_is_deterministic_by_seed_and_index() -> None:
    assert _chunks(1, 0) == _chunks(1, 0)
    assert [len(c) for c in _chunks(1, 0)] != [len(c) for c in _chunks(2, 0)]
    assert _chunks(1, 0) != _chunks(1, 1)
