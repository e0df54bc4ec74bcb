"""Engine presets: params to argv and env, for every engine."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from servesweep.errors import ConfigError
from servesweep.servers.engine_args import flag_args, nest_dotted, render_template
from servesweep.servers.engines import (
    PRESETS,
    build_launch,
    expand_model,
    get_preset,
    launch_command_text,
    merged_params,
)
from servesweep.spec.schema import ServerSpec


def spec(engine: str, **kw: Any) -> ServerSpec:
    kw.setdefault("model", "/models/m")
    kw.setdefault("port", 8123)
    return ServerSpec(engine=engine, **kw)  # type: ignore[arg-type]


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_schema_engine_has_a_preset() -> None:
    engines = ServerSpec.model_fields["engine"].annotation.__args__  # type: ignore[union-attr]
    assert set(engines) == set(PRESETS)
    for name, preset in PRESETS.items():
        assert preset.name == name
        assert get_preset(name) is preset


def test_unknown_engine_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'tgi'"):
        get_preset("tgi")


# --- flag spelling -----------------------------------------------------------------------


def test_flag_args_bool_styles() -> None:
    params = {"on_flag": True, "off_flag": False}
    assert flag_args(params, bool_style="flag") == ["--on-flag"]
    assert flag_args(params, bool_style="negate") == ["--on-flag", "--no-off-flag"]
    assert flag_args(params, bool_style="value") == ["--on-flag", "true", "--off-flag", "false"]
    assert flag_args(params, bool_style="negate", negatable={"on-flag"}) == ["--on-flag"]


def test_flag_args_values_lists_dicts_none_and_raw_short_flags() -> None:
    argv = flag_args({"a_b": 1.5, "lst": [1, "x"], "d": {"k": [1]}, "skip": None, "-c": 64})
    assert argv == ["--a-b", "1.5", "--lst", "1", "x", "--d", '{"k":[1]}', "-c", "64"]
    assert flag_args({"n-ctx": 8}, underscore=True) == ["--n_ctx", "8"]


def test_merged_params_trial_wins_regardless_of_spelling() -> None:
    s = spec("vllm", args={"max_num_seqs": 8, "dtype": "half"})
    assert merged_params(s, {"max-num-seqs": 16}) == {"dtype": "half", "max-num-seqs": 16}


def test_nest_dotted_builds_and_overrides_a_base_dict() -> None:
    out = nest_dotted(
        {
            "speculative_config": {"method": "ngram", "prompt-lookup-max": 4},
            "speculative-config.num_speculative_tokens": 5,
            "speculative_config.draft.x": 1,
            "other": 2,
        },
        {"speculative_config"},
    )
    assert out == {
        "other": 2,
        "speculative_config": {
            "method": "ngram",
            "prompt_lookup_max": 4,
            "num_speculative_tokens": 5,
            "draft": {"x": 1},
        },
    }
    with pytest.raises(ConfigError, match="must be a mapping"):
        nest_dotted({"speculative_config": "x"}, {"speculative_config"})


# --- per engine --------------------------------------------------------------------------


def test_vllm_argv_speculative_config_json_and_negated_booleans() -> None:
    argv, env = build_launch(
        spec("vllm", args={"tensor_parallel_size": 2}, gpus=[2, 3]),
        {
            "speculative_config.method": "eagle3",
            "speculative-config.num_speculative_tokens": 4,
            "speculative_config.model": "org/draft",
            "enable_prefix_caching": False,
            "enforce-eager": True,
            "compilation_config.cudagraph_capture_sizes": [1, 2, 4],
        },
    )
    assert argv[:3] == ["vllm", "serve", "/models/m"]
    assert after(argv, "--port") == "8123"
    assert after(argv, "--tensor-parallel-size") == "2"
    assert json.loads(after(argv, "--speculative-config")) == {
        "method": "eagle3",
        "num_speculative_tokens": 4,
        "model": "org/draft",
    }
    assert json.loads(after(argv, "--compilation-config")) == {"cudagraph_capture_sizes": [1, 2, 4]}
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_vllm_needs_a_model() -> None:
    with pytest.raises(ConfigError, match=r"needs server\.model"):
        build_launch(ServerSpec(engine="vllm"), {})


def test_sglang_argv_spec_flags_store_true_and_metrics_on() -> None:
    argv, _ = build_launch(
        spec("sglang"),
        {
            "speculative_algorithm": "DFLASH",
            "speculative-draft-model-path": "/d",
            "speculative_num_draft_tokens": 16,
            "speculative_eagle_topk": 6,
            "speculative_draft_window_size": 2048,
            "speculative_ddtree_budget": 12,
            "disable_cuda_graph": False,
            "trust_remote_code": True,
        },
    )
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert after(argv, "--model-path") == "/models/m"
    assert after(argv, "--speculative-algorithm") == "DFLASH"
    assert after(argv, "--speculative-draft-model-path") == "/d"
    assert after(argv, "--speculative-num-draft-tokens") == "16"
    assert after(argv, "--speculative-eagle-topk") == "6"
    assert after(argv, "--speculative-draft-window-size") == "2048"
    assert after(argv, "--speculative-ddtree-budget") == "12"
    assert "--enable-metrics" in argv and "--trust-remote-code" in argv
    assert not any("cuda-graph" in a for a in argv)
    # the default can be switched off
    argv, _ = build_launch(spec("sglang"), {"enable-metrics": False})
    assert "--enable-metrics" not in argv


def test_trtllm_argv_snake_case_flags_and_options_yaml(tmp_path: Path) -> None:
    argv, _ = build_launch(
        spec("trtllm", args={"backend": "pytorch", "tp_size": 4}),
        {
            "extra_llm_api_options.speculative_config.decoding_type": "Eagle",
            "extra_llm_api_options.speculative_config.max_draft_len": 3,
            "extra_llm_api_options.kv_cache_config.enable_block_reuse": False,
            "trust_remote_code": True,
            "enable_chunked_prefill": False,
        },
    )
    assert argv[:2] == ["trtllm-serve", "/models/m"]
    assert after(argv, "--tp_size") == "4" and after(argv, "--backend") == "pytorch"
    assert "--trust_remote_code" in argv and "--enable_chunked_prefill" not in argv
    options = json.loads(Path(after(argv, "--extra_llm_api_options")).read_text())
    assert options == {
        "kv_cache_config": {"enable_block_reuse": False},
        "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3},
    }
    # a file given as a path passes through; mixing both is an error
    argv, _ = build_launch(spec("trtllm"), {"config": "/etc/llm.yaml"})
    assert after(argv, "--extra_llm_api_options") == "/etc/llm.yaml"
    with pytest.raises(ConfigError, match="not both"):
        build_launch(
            spec("trtllm"),
            {"extra_llm_api_options": "/x.yaml", "extra_llm_api_options.a": 1},
        )


def test_llamacpp_python_argv_underscores_valued_booleans_and_env() -> None:
    argv, env = build_launch(
        spec("llamacpp", args={"n-threads": 2}, env={"OMP_NUM_THREADS": "2"}),
        {"n_ctx": 1024, "flash_attn": False, "tensor_split": [0.5, 0.5], "env.PORT": "1"},
    )
    assert argv[1:3] == ["-m", "llama_cpp.server"]
    assert after(argv, "--model") == "/models/m"
    assert after(argv, "--n_threads") == "2" and after(argv, "--n_ctx") == "1024"
    assert after(argv, "--flash_attn") == "false"
    assert after(argv, "--interrupt_requests") == "false"  # concurrent requests all run
    i = argv.index("--tensor_split")
    assert argv[i + 1 : i + 3] == ["0.5", "0.5"]
    # the engine's own HOST/PORT come from the spec; an explicit env.* param still wins
    assert env["HOST"] == "127.0.0.1" and env["PORT"] == "1"
    assert env["OMP_NUM_THREADS"] == "2" and "CUDA_VISIBLE_DEVICES" not in env
    preset = PRESETS["llamacpp"]
    assert preset.health_path is None and not preset.supports_ignore_eos
    assert not preset.streams_usage


def test_llama_server_argv_negates_only_negatable_flags() -> None:
    argv, _ = build_launch(
        spec("llama-server"),
        {
            "ctx_size": 4096,
            "cont_batching": False,
            "embedding": False,
            "-ngl": 99,
            "spec_draft_model": "/d.gguf",
            "spec-type": "draft-simple",
            "spec-draft-n-max": 8,
        },
    )
    assert argv[:3] == ["llama-server", "-m", "/models/m"]
    assert "--metrics" in argv
    assert after(argv, "--ctx-size") == "4096" and after(argv, "-ngl") == "99"
    assert "--no-cont-batching" in argv
    assert not any("embedding" in a for a in argv)
    assert after(argv, "--spec-draft-model") == "/d.gguf"
    assert after(argv, "--spec-draft-n-max") == "8"


def test_sim_argv_and_executable_override() -> None:
    argv, _ = build_launch(
        spec("sim", executable=["/opt/py", "-m", "servesweep.sim"]), {"load_s": 2, "x": True}
    )
    assert argv[:3] == ["/opt/py", "-m", "servesweep.sim"]
    assert after(argv, "--load-s") == "2" and "--x" in argv
    assert after(argv, "--model") == "/models/m"


def test_env_params_and_precedence() -> None:
    s = spec(
        "vllm",
        gpus=[0],
        env={"CUDA_VISIBLE_DEVICES": "5", "A": "spec"},
        args={"env.B": "args"},
    )
    argv, env = build_launch(s, {"env.A": "trial", "env.FLAG": True, "env.EMPTY": None})
    assert env == {"CUDA_VISIBLE_DEVICES": "5", "A": "trial", "B": "args", "FLAG": "1", "EMPTY": ""}
    assert not any(a.startswith("--env") for a in argv)


# --- generic templates -------------------------------------------------------------------


def test_generic_template_quotes_every_value() -> None:
    s = spec(
        "generic",
        model="/models/my model",
        gpus=[1, 2],
        command="my-server --model {model} --tp {param.tp} {args} --gpus {gpus} --port {port}",
    )
    argv, env = build_launch(s, {"tp-size": 1, "tp": 2, "name": "a b; rm -rf /", "q": "it's"})
    assert argv == [
        "my-server",
        "--model",
        "/models/my model",
        "--tp",
        "2",
        "--tp-size",
        "1",
        "--name",
        "a b; rm -rf /",
        "--q",
        "it's",
        "--gpus",
        "1,2",
        "--port",
        "8123",
    ]
    assert env == {"CUDA_VISIBLE_DEVICES": "1,2"}


def test_generic_template_with_shell_syntax_runs_under_sh_with_quoted_values() -> None:
    s = spec("generic", command="source /opt/env && exec srv --port {port} {args} >${LOG}")
    argv, _ = build_launch(s, {"name": "a'b $(touch /tmp/x)"})
    assert argv[:2] == ["/bin/sh", "-c"]
    assert shlex.split(argv[2].split("&&", 1)[1].split(">")[0]) == [
        "exec",
        "srv",
        "--port",
        "8123",
        "--name",
        "a'b $(touch /tmp/x)",
    ]
    assert "${LOG}" in argv[2]


@pytest.mark.parametrize(
    ("command", "params", "message"),
    [
        ("srv {param.missing}", {}, "no param 'missing'"),
        ("srv --port {prot}", {}, "unknown placeholder {prot}"),
        ("srv 'unclosed {args}", {}, "cannot be split"),
    ],
)
def test_generic_template_errors(command: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_template(command, spec("generic", command="x"), params)


def test_generic_template_model_placeholder_needs_a_model() -> None:
    with pytest.raises(ConfigError, match=r"server\.model"):
        render_template("srv {model}", ServerSpec(engine="generic", command="x"), {})


def test_launch_command_text_is_copy_pasteable() -> None:
    text = launch_command_text(["vllm", "serve", "/m/a b"], {"X": "1 2"})
    assert text == "X='1 2' vllm serve '/m/a b'"
    assert shlex.split(text) == ["X=1 2", "vllm", "serve", "/m/a b"]


def test_model_path_takes_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SS_MODELS", "/data/models")
    argv, _ = build_launch(spec("llamacpp", model="${SS_MODELS}/tiny.gguf"), {})
    assert after(argv, "--model") == "/data/models/tiny.gguf"
    assert expand_model("$A/x-$B", {"A": "a", "B": "b"}) == "a/x-b"
    monkeypatch.delenv("SS_MISSING", raising=False)
    with pytest.raises(ConfigError, match=r"\$SS_MISSING, which is not set"):
        build_launch(spec("vllm", model="$SS_MISSING/m"), {})


@pytest.mark.parametrize(
    ("executable", "positional"),
    [
        (None, True),
        (["/opt/v/bin/vllm", "serve"], True),
        (["/opt/v/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"], True),
        (["/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"], False),
    ],
)
def test_vllm_model_is_positional_for_serve_and_a_flag_for_the_api_server_module(
    executable: list[str] | None, positional: bool
) -> None:
    # the api_server module parses `vllm serve`'s flags but only `vllm serve` copies the
    # positional model to --model: there it was ignored and vLLM loaded its default model
    kw: dict[str, Any] = {"executable": executable} if executable else {}
    argv, _ = build_launch(spec("vllm", **kw), {"max-num-seqs": 4})
    program = len(executable) if executable else 2
    if positional:
        assert argv[program] == "/models/m" and "--model" not in argv
    else:
        assert argv[program : program + 2] == ["--model", "/models/m"]
    assert after(argv, "--max-num-seqs") == "4"
