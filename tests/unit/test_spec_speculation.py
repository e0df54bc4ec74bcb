"""Speculative decoding that an engine silently does not run: a draft model without a
speculation type (llama-server, SGLang), a draft knob without the kind it tunes, a
llama-cpp-python ``draft_model`` that is a path. Refused with the fix in one line by
the rule itself, when the sweep file is loaded (so by ``plan``, ``run`` and
``doctor`` before any launch) and at every launch (``build_launch``: ``apply --set``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servesweep.cli.main import main
from servesweep.errors import ConfigError
from servesweep.servers.engines import build_launch
from servesweep.spec import load_sweep_text
from servesweep.spec.schema import ServerSpec
from servesweep.spec.speculation import silent_speculation

DRAFT = "/models/draft.gguf"


@pytest.mark.parametrize(
    "params",
    [
        {"model-draft": DRAFT},
        {"md": DRAFT},
        {"spec_draft_model": DRAFT, "spec-draft-n-max": 8},
        {"--model-draft": DRAFT, "spec-type": "ngram-mod,none"},
        {"model-draft": DRAFT, "spec-type": "ngram-simple"},  # the draft is still unused
        {"env.LLAMA_ARG_SPEC_DRAFT_MODEL": DRAFT},
        {"hfd": "org/draft-GGUF"},
    ],
)
def test_llama_server_draft_without_a_draft_type_is_named_with_its_fix(
    params: dict[str, Any],
) -> None:
    problem = silent_speculation("llama-server", params)
    assert problem is not None
    assert problem.startswith("llama-server: a draft model (")
    assert "drafts nothing" in problem
    assert "add spec-type: draft-simple" in problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    "params",
    [
        {"model-draft": DRAFT, "spec-type": "draft-simple", "spec-draft-n-max": 8},
        {"md": DRAFT, "spec_type": "ngram-mod,draft-simple"},
        {"md": DRAFT, "spec-type": ["draft-eagle3"]},
        {"md": DRAFT, "env.LLAMA_ARG_SPEC_TYPE": "draft-simple"},
        {"md": DRAFT, "spec-type": "none"},  # said explicitly: the draft's memory only
        {"spec-type": "draft-mtp", "spec-draft-n-max": 3},  # MTP heads of the model itself
        {"spec-type": "ngram-simple", "spec-ngram-simple-size-n": 3},
        {"spec-default": True, "spec-ngram-mod-n-max": 32},
        {"spec-type": "ngram-map-k4v", "spec-ngram-map-k4v-size-m": 8},
        {"model-draft": None, "spec-draft-n-max": None, "ctx-size": 4096},
        {"threads": 2, "metrics": True},
    ],
)
def test_llama_server_speculation_that_runs_passes(params: dict[str, Any]) -> None:
    assert silent_speculation("llama-server", params) is None


def test_the_server_environment_counts_as_the_engine_reads_it() -> None:
    typed = {"LLAMA_ARG_SPEC_TYPE": "draft-simple"}
    assert silent_speculation("llama-server", {"md": DRAFT}, typed) is None
    draft = {"LLAMA_ARG_SPEC_DRAFT_MODEL": DRAFT}
    assert silent_speculation("llama-server", {}, draft) is not None


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"spec-draft-n-max": 8}, "spec-draft-n-max=8 acts only with a draft spec-type"),
        ({"spec-draft-p-min": 0.9, "spec-type": "ngram-mod"}, "spec-draft-p-min=0.9"),
        ({"spec-type": "ngram-mod", "spec-ngram-simple-size-n": 4}, "spec-type ngram-simple,"),
        ({"spec-ngram-map-k-size-m": 4, "spec-type": "ngram-map-k4v"}, "spec-type ngram-map-k,"),
    ],
)  # fmt: skip
def test_llama_server_knob_without_its_kind_changes_nothing(
    params: dict[str, Any], named: str
) -> None:
    problem = silent_speculation("llama-server", params)
    assert problem is not None and named in problem, problem


def test_sglang_draft_or_knob_without_an_algorithm() -> None:
    problem = silent_speculation("sglang", {"speculative-draft-model-path": "/d"})
    assert problem is not None
    assert "without speculative-algorithm is not used" in problem
    assert "add speculative-algorithm: STANDALONE" in problem
    knob = silent_speculation("sglang", {"speculative_num_draft_tokens": 16})
    assert knob is not None and "speculative-num-draft-tokens=16" in knob
    runs = {"speculative-algorithm": "DFLASH", "speculative-draft-model-path": "/d"}
    assert silent_speculation("sglang", runs) is None
    assert silent_speculation("sglang", {"tp-size": 8}) is None


def test_llamacpp_draft_model_is_a_method_not_a_model() -> None:
    problem = silent_speculation("llamacpp", {"draft_model": DRAFT})
    assert problem is not None and "draft_model: prompt-lookup-decoding" in problem
    alone = silent_speculation("llamacpp", {"draft_model_num_pred_tokens": 4})
    assert alone is not None and "without draft_model" in alone
    lookup = {"draft_model": "prompt-lookup-decoding", "draft_model_num_pred_tokens": 4}
    assert silent_speculation("llamacpp", lookup) is None


def test_vllm_and_others_have_no_such_case() -> None:
    # vLLM infers the method from the draft (draft_model by default): it speculates
    assert silent_speculation("vllm", {"speculative_config.model": "/d"}) is None
    assert silent_speculation("generic", {"model-draft": DRAFT}) is None


SWEEP = """\
name: spec
server:
  engine: llama-server
  model: /models/m.gguf
  port: 8090
  args: {{threads: 2{args}}}
params:
{params}
workloads:
  - {{name: chat, dataset: builtin:chat, concurrency: [1], requests: 2, max_tokens: 8}}
"""


def _sweep(params: str, args: str = "") -> str:
    return SWEEP.format(params=params, args=args)


def test_a_sweep_file_with_a_draft_but_no_type_is_refused_at_load() -> None:
    text = _sweep("  grid: {spec-draft-n-max: [2, 8]}", args=", model-draft: /d.gguf")
    with pytest.raises(ConfigError) as caught:
        load_sweep_text(text, "spec.yaml")
    message = str(caught.value)
    assert "configuration {spec-draft-n-max: 2}" in message
    assert "add spec-type: draft-simple" in message
    assert "spec.yaml" in message and "\n" not in message


def test_the_no_draft_baseline_beside_draft_points_loads() -> None:
    params = (
        "  points:\n"
        "    - {}\n"
        "    - {model-draft: /d.gguf, spec-type: draft-simple, spec-draft-n-max: 4}\n"
        "    - {spec-type: ngram-simple, spec-ngram-simple-size-n: 3}"
    )
    loaded = load_sweep_text(_sweep(params), "spec.yaml")
    assert len(loaded.spec.params.points) == 3


def test_a_draft_in_server_args_is_named_there() -> None:
    text = _sweep("  points: [{}]", args=", model-draft: /d.gguf")
    with pytest.raises(ConfigError, match=r"server\.args.*llama-server: a draft model"):
        load_sweep_text(text, "spec.yaml")


def test_a_launch_refuses_it_too() -> None:
    server = ServerSpec(engine="llama-server", model="/models/m.gguf")
    with pytest.raises(ConfigError, match="add spec-type: draft-simple"):
        build_launch(server, {"model-draft": "/d.gguf", "spec-draft-n-max": 4})
    argv, _ = build_launch(server, {"model-draft": "/d.gguf", "spec-type": "draft-simple"})
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"


@pytest.mark.parametrize("command", ["plan", "doctor", "run"])
def test_plan_doctor_and_run_say_it_in_one_line_before_any_launch(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(_sweep("  grid: {spec-draft-n-max: [2, 8]}", args=", md: /d.gguf"))
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(path)])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "md=/d.gguf" in lines[0] and "add spec-type: draft-simple" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no store, no logs
