"""Every valid HTTP framing is measured, every invalid one classified: the readiness
gate, doctor's probe and the load generator against one server that answers in a
different framing on each of its ports (fixtures_lifecycle/framing_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.integration.fixtures_lifecycle.framing_server import INVALID, VALID
from tests.integration.fixtures_lifecycle.helpers import (
    HERE,
    Tracker,
    free_port,
    request,
    wait_for,
)

from servesweep.bench.load import run_workload_sync
from servesweep.bench.target import Target
from servesweep.errors import TrialFailed
from servesweep.metrics_catalog import COMPLETED, COMPLETION_TOKENS_MEAN
from servesweep.models import FailureClass, InstanceRecord
from servesweep.servers.doctor import diagnose
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu import NoGpuProbe
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.readiness import ReadyInfo, wait_ready
from servesweep.spec.schema import ServerSpec, workload_spec

pytestmark = pytest.mark.integration

FRAMING_SERVER = str(HERE / "framing_server.py")
SIM = get_preset("sim")
MODEL = "framing-model"


@dataclass
class Framings:
    launcher: SubprocessLauncher
    instance: InstanceRecord
    ports: dict[str, int]


@pytest.fixture(scope="module")
def framings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Framings]:
    tmp = tmp_path_factory.mktemp("framing")
    ports_file = tmp / "ports.json"
    launcher = SubprocessLauncher()
    argv = [sys.executable, FRAMING_SERVER, "--ports-file", str(ports_file), "--model", MODEL]
    tracker = Tracker()
    try:
        # free_port: the launch request names a port; the server listens on its own
        inst = tracker.track(
            launcher, launcher.start(request(argv, free_port(), tmp / "s.log", "fr-1"))
        )
        assert wait_for(ports_file.exists), (tmp / "s.log").read_text()
        yield Framings(launcher, inst, json.loads(ports_file.read_text()))
    finally:
        tracker.cleanup()


def _gate(f: Framings, name: str, deadline: float = 20) -> ReadyInfo | TrialFailed:
    try:
        return wait_ready(
            f.launcher,
            f.instance,
            SIM,
            host="127.0.0.1",
            port=f.ports[name],
            model=None,
            deadline_s=deadline,
        )
    except TrialFailed as exc:
        return exc


def test_a_close_delimited_stream_with_a_delay_before_the_first_token_is_ready(
    framings: Framings,
) -> None:
    # The symptom: `Connection: close`, no Content-Length, no chunks, 60 ms
    # between the headers and the first token: every request failed with
    # "OSError: [Errno 9] Bad file descriptor" and the trial was a serve_error.
    result = _gate(framings, "delayed")
    assert isinstance(result, ReadyInfo), str(result)
    assert result.model == MODEL


def test_the_readiness_gate_measures_valid_framings_and_classifies_invalid_ones(
    framings: Framings,
) -> None:
    names = VALID + INVALID
    with ThreadPoolExecutor(len(names)) as pool:  # the invalid ones take 3 s of failures
        results = dict(zip(names, pool.map(lambda n: _gate(framings, n), names), strict=True))
    for name in VALID:
        assert isinstance(results[name], ReadyInfo), f"{name}: {results[name]}"
    for name in INVALID:
        failure = results[name]
        assert isinstance(failure, TrialFailed), f"{name}: {failure}"
        assert failure.failure_class is FailureClass.SERVE_ERROR, f"{name}: {failure}"
        assert failure.evidence.reason == "generation_failed"
        assert "Bad file descriptor" not in failure.evidence.message
    assert "valid HTTP answer" in results["garbage"].evidence.message  # type: ignore[union-attr]
    assert "not completed" in results["truncated"].evidence.message  # type: ignore[union-attr]
    assert "reset" in results["reset"].evidence.message.lower()  # type: ignore[union-attr]


def _doctor_engine(port: int, model: str | None = MODEL) -> dict[str, object]:
    spec = ServerSpec(engine="sim", port=port, gpus=[], served_model_name=model)
    engine = diagnose(spec, NoGpuProbe())["engine"]
    assert isinstance(engine, dict)
    return engine


def test_doctor_measures_valid_framings_and_reports_invalid_ones(framings: Framings) -> None:
    names = VALID + INVALID
    with ThreadPoolExecutor(4) as pool:
        reports = dict(
            zip(names, pool.map(lambda n: _doctor_engine(framings.ports[n]), names), strict=True)
        )
    for name in VALID:
        engine = reports[name]
        endpoints = engine["endpoints"]
        assert isinstance(endpoints, dict)
        assert endpoints["health"]["status"] == 200, f"{name}: {engine}"
        assert endpoints["models"]["models"] == [MODEL], f"{name}: {engine}"
        assert engine["generation"] == {
            "path": "/v1/completions",
            "status": 200,
            "ms": engine["generation"]["ms"],  # type: ignore[index]
            "model": MODEL,
            "tokens": 3,
            "ok": True,
        }, name
    for name in INVALID:
        engine = reports[name]
        generation = engine["generation"]
        assert isinstance(generation, dict)
        assert generation["ok"] is False and generation["tokens"] == 0, f"{name}: {engine}"
        assert "error" in generation, f"{name}: {engine}"
        assert "error" in engine["endpoints"]["health"], f"{name}: {engine}"  # type: ignore[index]
        assert "Bad file descriptor" not in json.dumps(engine)


def _bench(f: Framings, name: str) -> dict[str, object]:
    target = Target(base_url=f"http://127.0.0.1:{f.ports[name]}", model=MODEL, timeout_s=10)
    workload = workload_spec(
        name="w", endpoint="completions", concurrency=[1], requests=2, max_tokens=3
    )
    (level,) = run_workload_sync(target, workload)
    return {"metrics": dict(level.metrics), "info": dict(level.info)}


def test_the_load_generator_measures_valid_framings_and_classifies_invalid_ones(
    framings: Framings,
) -> None:
    expected_error = {"garbage": "bad_response", "truncated": "incomplete", "reset": "incomplete"}
    for name in VALID + INVALID:
        level = _bench(framings, name)
        metrics, info = level["metrics"], level["info"]
        assert isinstance(metrics, dict) and isinstance(info, dict)
        if name in VALID:
            assert metrics[COMPLETED.name] == 2, f"{name}: {level}"
            assert metrics[COMPLETION_TOKENS_MEAN.name] == 3, f"{name}: {level}"
        else:
            assert metrics[COMPLETED.name] == 0, f"{name}: {level}"
            assert info["errors"] == {expected_error[name]: 2}, f"{name}: {level}"


def test_doctor_against_python_http_server_reports_its_http_1_0_answers(
    tmp_path: Path,
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from servesweep.servers import ports

        assert wait_for(lambda: ports.owned_by("127.0.0.1", port, {proc.pid}))
        t0 = time.monotonic()
        engine = _doctor_engine(port, None)
        assert time.monotonic() - t0 < 10
    finally:
        proc.kill()
        proc.wait(timeout=5)
    endpoints = engine["endpoints"]
    assert isinstance(endpoints, dict)
    assert endpoints["health"]["status"] == 404, engine  # an HTTP/1.0 answer, read whole
    assert endpoints["models"]["status"] == 404, engine
    assert engine["generation"] == {
        "ok": False,
        "error": "no model name (no served_model_name, and /v1/models listed none)",
    }
    assert "Bad file descriptor" not in json.dumps(engine)
