"""Does the server run what was asked, against llama.cpp's real ``llama-server``
(built by dev/install-llama-server.sh) on a random-weight GGUF whose training context
is 512 tokens: what its ``/props`` says for a ``ctx-size`` and ``parallel`` it honours
and for a ``ctx-size`` beyond what the model allows, read by the comparison a sweep
makes and then through a sweep."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sweep_helpers import run_cli

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from helpers.llama_server import cached_llama_server, llama_server_sweep
from servesweep.servers.config_check import check_server, compare_llama_server
from servesweep.servers.http_probe import http_call
from servesweep.sim.testing import free_port
from servesweep.store import open_store

pytestmark = pytest.mark.integration

TRAINED = 512
SHAPE = TinyLlamaShape(n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=256,
                       context_length=TRAINED)  # fmt: skip


@pytest.fixture(scope="module")
def llama_server() -> str:
    return cached_llama_server()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "short.gguf", shape=SHAPE)


def _props(binary: str, model: Path, log: Path, *args: str) -> dict[str, Any]:
    """``/props`` of a llama-server started with ``args``, stopped again."""
    port = free_port()
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--threads", "2", "-ngl", "0", *args]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):  # bounded: 600 polls of at most 1 s + 0.1 s
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited {proc.returncode}: {log.read_text()[-2000:]}")
            answer = http_call("127.0.0.1", port, "GET", "/health", api_key=None, timeout=1.0)
            if not isinstance(answer, str) and answer.status == 200:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.1)
        else:
            pytest.fail("llama-server not healthy in time")
        asked = dict(zip(args[::2], args[1::2], strict=True))
        params = {k.lstrip("-"): v for k, v in asked.items()}
        # the same question a sweep asks, through the same helper
        props = http_call("127.0.0.1", port, "GET", "/props", api_key=None, timeout=5.0)
        assert not isinstance(props, str) and props.status == 200, props
        payload: dict[str, Any] = props.json()
        found = check_server("llama-server", "127.0.0.1", port, params)
        assert found == compare_llama_server(params, payload)
        return payload
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.timeout(300)
def test_props_say_the_context_the_slots_got(
    llama_server: str, model: Path, tmp_path: Path
) -> None:
    honoured = _props(llama_server, model, tmp_path / "a.log", "--ctx-size", "512",
                      "--parallel", "2")  # fmt: skip
    settings = honoured["default_generation_settings"]
    assert honoured["total_slots"] == 2
    assert compare_llama_server({"ctx-size": 512, "parallel": 2}, honoured) == []
    assert compare_llama_server({"parallel": 4}, honoured)[0].engine == 2
    # past the GGUF's training context the slot gets the training context: a mismatch
    beyond = _props(llama_server, model, tmp_path / "b.log", "--ctx-size", "4096",
                    "--parallel", "1")  # fmt: skip
    assert beyond["default_generation_settings"]["n_ctx"] == TRAINED
    (mismatch,) = compare_llama_server({"ctx-size": 4096, "parallel": 1}, beyond)
    assert (mismatch.param, mismatch.asked, mismatch.engine) == ("ctx-size", 4096, TRAINED)
    assert mismatch.source == "/props default_generation_settings.n_ctx"
    print(json.dumps({"honoured": settings["n_ctx"], "beyond": TRAINED}))


@pytest.mark.timeout(600)
def test_a_sweep_marks_the_capped_context(llama_server: str, model: Path, tmp_path: Path) -> None:
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name="capped",
        binary=llama_server,
        model=model,
        port=free_port(),
        points=[{"parallel": 1, "ctx-size": 4096}, {"parallel": 1, "ctx-size": 512}],
        workloads=[
            {
                "name": "chat",
                "dataset": "builtin:chat",
                "concurrency": [1],
                "requests": 2,
                "max_tokens": 4,
            }
        ],
    )
    done = run_cli("run", str(sweep), timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    said = (
        f"ctx-size asked 4096, the engine runs {TRAINED} (/props default_generation_settings.n_ctx)"
    )
    assert f"the server does not run what was asked: {said}" in done.stderr + done.stdout
    with open_store(tmp_path / "capped.db", readonly=True) as store:
        data = store.load_sweep_data(with_samples=False)
    (stored,) = data.mismatches
    by_ctx = {t.params["ctx-size"]: t.id for t in data.trials}
    assert stored["trial"] == by_ctx[4096]
    status = run_cli("status", str(sweep)).stdout
    (line,) = [row for row in status.splitlines() if "ctx-size=4096" in row]
    assert f"config_mismatch: {said}" in line
