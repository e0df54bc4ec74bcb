"""The sweep files a user copies from examples/: each passes `servesweep plan`, and
the unit files and container settings they rely on say what a sweep needs."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
import yaml
from tests.integration.sweep_helpers import run_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SWEEPS = sorted(EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("sweep", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_example_passes_plan(sweep: Path) -> None:
    done = run_cli("plan", str(sweep))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trials:" in done.stdout


def _unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(EXAMPLES / "systemd" / name)
    return unit


@pytest.mark.parametrize(
    ("sweep", "unit_file"),
    [("vllm-systemd.yaml", "vllm.service"), ("incident-ddtree.yaml", "sglang-kimi.service")],
)
def test_systemd_examples_ship_the_unit_they_drive(sweep: str, unit_file: str) -> None:
    spec = yaml.safe_load((EXAMPLES / sweep).read_text())
    assert spec["server"]["launcher"] == "systemd"
    assert spec["server"]["systemd"]["unit"] == unit_file
    service = _unit(unit_file)["Service"]
    assert service["Type"] == "simple"
    assert service["KillMode"] == "control-group"
    assert service["Restart"] == "no"
    # servesweep's stop grace matches what systemd allows before SIGKILL
    stop = spec["server"]["timeouts"]["stop"]
    seconds = int(stop[:-1]) * (60 if stop.endswith("m") else 1)
    assert int(service["TimeoutStopSec"]) == seconds
    lines = (EXAMPLES / "systemd" / unit_file).read_text().splitlines()
    assert not [ln for ln in lines if "HF_TOKEN" in ln and not ln.startswith("#")]
    assert "HF_TOKEN" in spec["server"]["env_passthrough"]


def test_incident_example_is_the_incidents_sweep() -> None:
    spec = yaml.safe_load((EXAMPLES / "incident-ddtree.yaml").read_text())
    server = spec["server"]
    assert server["engine"] == "sglang" and server["gpus"] == list(range(8))
    assert server["args"]["tp-size"] == 8
    points = spec["params"]["points"]
    knobs = {
        (
            p["speculative-ddtree-budget"],
            p["speculative-eagle-topk"],
            p.get("speculative-draft-window-size"),
        )
        for p in points
    }
    assert knobs == {(8, 4, None), (16, 4, 2048), (4, 4, 2048), (12, 6, 2048)}


def test_docker_example_names_image_mounts_and_program() -> None:
    server = yaml.safe_load((EXAMPLES / "sglang-docker.yaml").read_text())["server"]
    assert server["launcher"] == "docker" and server["docker"]["image"]
    # inside the image there is no servesweep interpreter: the program is explicit
    assert server["executable"] == ["python3", "-m", "sglang.launch_server"]
    assert "--ipc=host" in server["docker"]["run_args"]
    assert server["env_passthrough"] == ["HF_TOKEN"]


def test_real_spec_decode_example_sweeps_the_qwen_draft_beside_a_baseline() -> None:
    """The worked example on real models (docs/real-models.md): its paths are those
    dev/fetch-models.sh caches (relative to the models folder it runs from), every
    drafting configuration names a spec-type, and the baseline loads no draft."""
    spec = yaml.safe_load((EXAMPLES / "real-spec-decode.yaml").read_text())
    server, params = spec["server"], spec["params"]
    assert server["engine"] == "llama-server"
    assert server["model"] == "qwen2.5-coder-1.5b/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"
    grid = params["grid"]
    assert grid["spec-draft-model"] == [
        "qwen2.5-coder-0.5b/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"
    ]
    assert grid["spec-type"] == ["draft-simple"]
    assert len(grid["spec-draft-n-max"]) >= 2 and len(grid["spec-draft-p-min"]) >= 2
    assert params["points"] == [{}]
    kinds = {w["name"]: w for w in spec["workloads"]}
    assert kinds["chat"]["dataset"] == "builtin:chat"
    assert kinds["coding"]["dataset"] == "builtin:coding"
    assert kinds["eval"]["eval"]["suite"] == "builtin:coding"
    assert spec["constraints"] == ["eval.pass_rate >= 0.8"]
    # the files the paths name are the ones the fetch script writes
    fetch = (EXAMPLES.parent / "dev" / "fetch_models.py").read_text()
    for path in (server["model"], grid["spec-draft-model"][0]):
        name, file = path.split("/")
        assert f'name="{name}"' in fetch and f'file="{file}"' in fetch
