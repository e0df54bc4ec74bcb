"""``servesweep plan`` shows each configuration's predicted performance beside its
predicted memory, from the trials already in the results database (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesweep.cli.main import main
from servesweep.decide.perf.inputs import perf_setting
from servesweep.models import LevelResult, Outcome, ServerConfig
from servesweep.spec.load import load_sweep_text
from servesweep.store import open_store

SWEEP = """
name: perfplan
server:
  engine: sim
  gpus: [0]
  gpu_backend: fake
  fake_gpu_dir: gpus
  fake_gpus: {count: 1, memory: 80GiB}
params:
  grid:
    max-num-seqs: [8, 16, 32, 64, 128, 256]
workloads: [{name: chat, concurrency: [1, 4]}]
objective: {maximize: output_throughput, workload: chat, concurrency: 4}
constraints: ["chat.c1.ttft_p99_ms < 500"]
"""
OBJECTIVE = "chat.c4.output_throughput"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, _ = capsys.readouterr()
    assert isinstance(exit_info.value.code, int)
    return exit_info.value.code, out


def _measure(db_path: Path, name: str, seqs: int, throughput: float) -> None:
    with open_store(db_path) as db:
        sweep = db.latest_sweep(name) or db.create_sweep(name, "s.yaml", SWEEP, "h", "0")
        trial = db.ensure_trial(sweep.id, ServerConfig.of({"max-num-seqs": seqs}), in_plan=True)
        db.begin_attempt(trial.id, 1.0, None)
        for level, metrics in (
            ("c1", {"output_throughput": throughput / 3, "ttft_p99_ms": 120.0}),
            ("c4", {"output_throughput": throughput, "ttft_p99_ms": 180.0}),
        ):
            db.add_result(trial.id, LevelResult("chat", level, 0, metrics))
        db.finish_trial(trial.id, Outcome.OK, 2.0)


def test_the_plan_predicts_from_the_trials_in_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SWEEP)
    db = tmp_path / "results.db"
    code, out = _run(capsys, "plan", str(sweep), "--store", str(db), "--json")
    assert code == 0
    before = [t["predicted_performance"][OBJECTIVE] for t in json.loads(out)["trials"]]
    assert {p["basis"] for p in before} == {"unknown"}  # nothing measured yet
    _measure(db, "perfplan", 32, 1000.0)
    code, out = _run(capsys, "plan", str(sweep), "--store", str(db), "--json")
    trials = {t["params"]["max-num-seqs"]: t for t in json.loads(out)["trials"]}
    assert trials[32]["predicted_performance"][OBJECTIVE]["basis"] == "measured"
    assert trials[32]["predicted_performance"][OBJECTIVE]["value"] == 1000.0
    near = trials[64]["predicted_performance"][OBJECTIVE]
    assert near["basis"] == "empirical" and near["low"] < near["value"] < near["high"]
    assert trials[256]["predicted_performance"][OBJECTIVE]["basis"] == "unknown"  # far
    assert "predicted_memory" in trials[256]
    code, out = _run(capsys, "plan", str(sweep), "--store", str(db))
    assert code == 0
    assert "performance (predicted from 1 measured trial(s) of this sweep and 0 of" in out
    assert "1000 (measured)" in out and "unknown" in out
    with open_store(db) as store:  # a new sweep of the same name: the old one starts it
        store.create_sweep("perfplan", "s.yaml", SWEEP, "h2", "0")
    code, out = _run(capsys, "plan", str(sweep), "--store", str(db))
    assert "from 0 measured trial(s) of this sweep and 1 of earlier sweeps" in out
    assert "1000 (measured)" in out
    assert "starts warm from 1 measured trial(s) of earlier sweep(s) #1 (same name" in out
    sweep.write_text(SWEEP.replace("[1, 4]", "[1, 2, 4]"))  # another workload: not its past
    code, out = _run(capsys, "plan", str(sweep), "--store", str(db))
    assert "from 0 measured trial(s) of this sweep and 0 of earlier sweeps" in out
    said = " ".join(out.split())
    assert "earlier sweep #1 of the same name does not start the performance prediction: it" in said
    assert "measured under other settings: workload 'chat' (concurrency)" in said


def test_the_setting_names_the_engines_draft_length_when_swept() -> None:
    text = SWEEP.replace("engine: sim", "engine: vllm\n  model: m").replace(
        "max-num-seqs: [8, 16, 32, 64, 128, 256]",
        "max-num-seqs: [8, 16]\n    speculative_config.num_speculative_tokens: [0, 2, 4]",
    )
    spec = load_sweep_text(text).spec
    setting = perf_setting(spec, "speculative_config.num_speculative_tokens")
    assert setting.metrics == (OBJECTIVE, "chat.c1.ttft_p99_ms")
    assert setting.draft_param == "speculative_config.num_speculative_tokens"
    assert setting.concurrency == {"chat.c4": 4.0, "chat.c1": 1.0}
    assert setting.invariant == {"acceptance_length": frozenset({"max-num-seqs"})}
    assert perf_setting(spec, None).draft_param is None


def test_the_drafters_params_give_acceptance_curves_of_their_own() -> None:
    text = SWEEP.replace("engine: sim", "engine: vllm\n  model: m").replace(
        "max-num-seqs: [8, 16, 32, 64, 128, 256]",
        "max-num-seqs: [8, 16]\n    speculative_config.method: [ngram]\n"
        "    speculative_config.num_speculative_tokens: [2, 4]\n"
        "    speculative_config.prompt_lookup_max: [3, 5]",
    )
    spec = load_sweep_text(text).spec
    speculative = ("speculative_config.method", "speculative_config.prompt_lookup_max")
    setting = perf_setting(spec, "speculative_config.num_speculative_tokens", speculative)
    assert setting.drafter == frozenset(speculative)
    # the batch does not change acceptance; the ngram lookup does (not invariant)
    assert setting.invariant == {"acceptance_length": frozenset({"max-num-seqs"})}
    assert perf_setting(spec, None, speculative).drafter == frozenset()


def test_a_draft_model_is_named_by_a_swept_param_or_by_the_servers_args() -> None:
    engine = "engine: vllm\n  model: m"
    grid = (
        "speculative_config.method: [ngram]\n    speculative_config.num_speculative_tokens: [2, 4]"
    )
    ngram = SWEEP.replace("engine: sim", engine).replace(
        "max-num-seqs: [8, 16, 32, 64, 128, 256]", grid
    )
    draft, speculative = "speculative_config.num_speculative_tokens", ("speculative_config.method",)
    models = ("speculative_config.model",)
    setting = perf_setting(load_sweep_text(ngram).spec, draft, speculative, models)
    assert setting.draft_models == frozenset() and not setting.model_drafts
    # the server's args, nested as the sweep file writes them
    fixed = ngram.replace(engine, engine + "\n  args: {speculative_config: {model: small}}")
    setting = perf_setting(load_sweep_text(fixed).spec, draft, speculative, models)
    assert setting.model_drafts and setting.draft_models == frozenset()
    # swept: the param as the sweep file spells it
    swept = ngram.replace(grid, grid + "\n    speculative_config.model: [small, tiny]")
    setting = perf_setting(load_sweep_text(swept).spec, draft, speculative, models)
    assert setting.draft_models == frozenset({"speculative_config.model"})
    assert not setting.model_drafts
    # llama-server's flags, with dashes
    llama = SWEEP.replace("engine: sim", "engine: llama-server\n  model: m.gguf").replace(
        "max-num-seqs: [8, 16, 32, 64, 128, 256]",
        "spec-draft-n-max: [1, 2]\n    spec-draft-model: [d.gguf]\n    spec-type: [draft-simple]",
    )
    models = ("spec_draft_model",)
    setting = perf_setting(load_sweep_text(llama).spec, "spec_draft_n_max", (), models)
    assert setting.draft_models == frozenset({"spec-draft-model"}) and not setting.cpu
    on_cpus = llama.replace("gpu_backend: fake", "gpu_backend: none")
    assert perf_setting(load_sweep_text(on_cpus).spec, "spec_draft_n_max", (), models).cpu


def test_a_param_set_by_the_draft_length_is_not_a_drafter_of_its_own() -> None:
    # llama-server's --spec-synth-rates must list one rate per drafted position: one
    # acceptance profile is a value per draft length, and tells nothing more
    points = "\n".join(
        f"    - {{spec-type: draft-simple, model-draft: d.gguf, spec-draft-n-max: {k}, "
        f"spec-synth-rates: '{','.join(['0.8'] * k)}'}}"
        for k in (1, 2, 4)
    )
    llama = SWEEP.replace("engine: sim", "engine: llama-server\n  model: m.gguf").replace(
        "  grid:\n    max-num-seqs: [8, 16, 32, 64, 128, 256]", f"  points:\n    - {{}}\n{points}"
    )
    draft, speculative = "spec_draft_n_max", ("spec_type", "spec_draft_n_max")
    setting = perf_setting(load_sweep_text(llama).spec, draft, speculative, ("model_draft",))
    assert setting.follows == frozenset({"spec-synth-rates"})
    # the draft model is the drafter's: the baseline, written without it, is its k = 0
    assert setting.drafter == frozenset({"spec-type", "model-draft"})
    assert "spec-synth-rates" not in setting.invariant["acceptance_length"]
    # a param swept across the draft lengths (a grid) is no follower
    grid = SWEEP.replace("engine: sim", "engine: llama-server\n  model: m.gguf").replace(
        "max-num-seqs: [8, 16, 32, 64, 128, 256]",
        "spec-draft-n-max: [1, 2]\n    spec-draft-p-min: [0.0, 0.8]\n"
        "    spec-type: [draft-simple]\n    spec-draft-model: [d.gguf]",
    )
    assert perf_setting(load_sweep_text(grid).spec, draft, speculative).follows == frozenset()


def test_the_predictions_noise_is_what_the_sweep_says_launches_vary() -> None:
    spec = load_sweep_text(SWEEP).spec
    assert perf_setting(spec).noise == 0.02  # decision.launch_sd's default
    noisy = load_sweep_text(SWEEP + "decision: {launch_sd: 10%}\n").spec
    assert perf_setting(noisy).noise == pytest.approx(0.10)
