"""The llamacpp preset against llama-cpp-python's REAL argument parser.

``python -m llama_cpp.server`` builds its argparse parser from the pydantic
``Settings`` model (``llama_cpp.server.cli.add_args_from_model``) plus
``--config_file``. We build the same parser, parse the argv the preset emits and
validate it into ``ServerSettings``/``ModelSettings`` like ``__main__`` does, so a
renamed flag, a wrong boolean style or a wrong list spelling fails here.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from servesweep.servers.engines import PRESETS, build_launch
from servesweep.spec.expand import expand_configs
from servesweep.spec.load import load_sweep
from servesweep.spec.schema import ServerSpec

server_cli = pytest.importorskip(
    "llama_cpp.server.cli",
    reason="llama-cpp-python[server] is not installed (dev/install-llamacpp.sh installs it)",
)
server_settings = pytest.importorskip("llama_cpp.server.settings")


def real_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    server_cli.add_args_from_model(parser, server_settings.Settings)
    parser.add_argument("--config_file", type=str)
    return parser


def parse(argv: list[str]) -> tuple[Any, Any]:
    """What ``llama_cpp.server.__main__`` does with the argv after the program."""
    assert argv[1:3] == ["-m", "llama_cpp.server"]
    args = real_parser().parse_args(argv[3:])
    server = server_cli.parse_model_from_args(server_settings.ServerSettings, args)
    model = server_cli.parse_model_from_args(server_settings.ModelSettings, args)
    return server, model


# Every param the example sweep and the docs use, with a non-default value.
PARAMS: dict[str, Any] = {
    "n_threads": 3,
    "n-threads-batch": 2,
    "n_batch": 64,
    "n_ubatch": 32,
    "n_ctx": 1024,
    "n_gpu_layers": 0,
    "flash_attn": True,
    "use_mmap": False,
    "offload_kqv": False,
    "seed": 7,
    "model_alias": "tiny",
    "tensor_split": [0.25, 0.75],
    "chat_template_kwargs": {"enable_thinking": False},
    "draft_model": "prompt-lookup-decoding",
    "draft_model_num_pred_tokens": 4,
    "verbose": False,
    "interrupt_requests": False,
}


def test_every_flag_the_preset_emits_is_accepted_and_lands_in_the_settings() -> None:
    spec = ServerSpec(engine="llamacpp", model="/models/tiny.gguf", host="127.0.0.1", port=8765)
    argv, _ = build_launch(spec, PARAMS)
    server, model = parse(argv)
    assert (server.host, server.port, server.interrupt_requests) == ("127.0.0.1", 8765, False)
    assert model.model == "/models/tiny.gguf"
    assert (model.n_threads, model.n_threads_batch, model.n_batch, model.n_ubatch) == (3, 2, 64, 32)
    assert (model.n_ctx, model.n_gpu_layers, model.seed) == (1024, 0, 7)
    assert model.flash_attn is True and model.use_mmap is False and model.offload_kqv is False
    assert model.verbose is False and model.model_alias == "tiny"
    assert model.tensor_split == [0.25, 0.75]
    assert model.chat_template_kwargs == {"enable_thinking": False}
    assert model.draft_model == "prompt-lookup-decoding"
    assert model.draft_model_num_pred_tokens == 4


def test_spec_params_listed_by_the_preset_exist_in_the_parser() -> None:
    options = {s for action in real_parser()._actions for s in action.option_strings}
    for name in PRESETS["llamacpp"].spec_params:
        assert f"--{name}" in options, name
    for flag in ("--model", "--host", "--port"):
        assert flag in options


def test_dashed_flags_would_be_rejected_by_the_real_parser() -> None:
    # Why the preset writes --snake_case for this engine (and --kebab-case elsewhere).
    with pytest.raises(SystemExit):
        real_parser().parse_args(["--model", "m", "--n-ctx", "8"])


def test_boolean_as_bare_flag_would_be_rejected_by_the_real_parser() -> None:
    # Booleans need a value here (--flash_attn true): a bare flag swallows the next arg.
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        real_parser().parse_args(["--model", "m", "--flash_attn", "--n_ctx", "8"])


def test_example_sweep_file_expands_to_argv_the_real_parser_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "llamacpp-cpu.yaml"
    monkeypatch.setenv("SERVESWEEP_GGUF", "/models/tiny.gguf")
    loaded = load_sweep(example)
    configs = expand_configs(loaded.spec)
    assert len(configs) >= 4
    assert len(loaded.spec.workloads) == 2
    seen = set()
    for config in configs:
        argv, env = build_launch(loaded.spec.server, config.params)
        _, model = parse(argv)
        assert model.model == "/models/tiny.gguf"
        assert env["PORT"] == str(loaded.spec.server.port)
        seen.add((model.n_threads, model.n_batch, model.n_ctx))
    assert len(seen) == len(configs)
