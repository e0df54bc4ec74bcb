"""The llamacpp preset driving the REAL ``python -m llama_cpp.server`` on 127.0.0.1.

A tiny random-weight GGUF (tests/helpers/gguf_model.py) is written at test time;
the server is started from the preset's argv and env by the subprocess launcher,
proven ready by the readiness gate, then asked for models, streamed and plain
completions and chat. The failure cases start it with a flag it rejects, a value
its settings reject and a model path that does not exist, and check the classified
failure and its evidence. Text is random: only mechanics are asserted.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from helpers.gguf_model import write_tiny_gguf
from servesweep.errors import TrialFailed
from servesweep.models import FailureClass, InstanceRecord
from servesweep.servers.engines import PRESETS, build_launch
from servesweep.servers.launchers.base import LaunchRequest
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.logs import match_fatal
from servesweep.servers.readiness import ReadyInfo, wait_ready
from servesweep.spec.schema import ServerSpec

pytest.importorskip(
    "llama_cpp.server.app",
    reason="llama-cpp-python[server] is not installed (dev/install-llamacpp.sh installs it)",
)

PRESET = PRESETS["llamacpp"]
READY_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Started:
    def __init__(self, spec: ServerSpec, instance: InstanceRecord, log_path: Path) -> None:
        self.spec = spec
        self.instance = instance
        self.log_path = log_path

    @property
    def base(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """Start llama_cpp.server through the preset and the subprocess launcher;
    every instance is stopped (process group, then PIDs) when the test ends."""
    launcher = SubprocessLauncher()
    started: list[InstanceRecord] = []

    def start(model: str, params: dict[str, Any]) -> Started:
        spec = ServerSpec(engine="llamacpp", model=model, port=free_port())
        argv, env = build_launch(spec, params)
        log_path = tmp_path / f"server-{len(started)}.log"
        request = LaunchRequest(
            argv=argv,
            env=env,
            host=spec.host,
            port=spec.port,
            gpus=(),
            log_path=log_path,
            trial_key=f"llamacpp-test-{len(started)}",
            fingerprint="test",
        )
        instance = launcher.start(request)
        started.append(instance)
        return Started(spec, instance, log_path)

    def ready(s: Started) -> ReadyInfo:
        return wait_ready(
            launcher,
            s.instance,
            PRESET,
            host=s.spec.host,
            port=s.spec.port,
            model=None,
            deadline_s=READY_DEADLINE_S,
        )

    start.ready = ready  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for instance in started:
            result = launcher.stop(instance, grace=5.0, kill_timeout=5.0)
            # reap the child (stop may return while it is a zombie, not yet waited for)
            assert launcher.poll(instance) is not None
            assert not result.survivors, f"server processes survived: {result.survivors}"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: dict[str, Any]) -> Any:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def stream(url: str, body: dict[str, Any], max_events: int = 512) -> list[dict[str, Any]]:
    """The SSE events of one streamed request (bounded in count and time)."""
    data = json.dumps({**body, "stream": True}).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return events
            events.append(json.loads(payload))
            assert len(events) <= max_events and time.monotonic() < deadline
    raise AssertionError("the stream ended without [DONE]")


@pytest.mark.parametrize(
    "params",
    [
        {"n_threads": 1, "n_batch": 64, "n_ctx": 512},
        {"n_threads": 2, "n_ctx": 1024, "draft_model": "prompt-lookup-decoding"},
    ],
    ids=["plain", "prompt-lookup-draft"],
)
def test_real_server_is_ready_and_serves(
    launch: Any, tiny_gguf: Path, params: dict[str, Any]
) -> None:
    s = launch(str(tiny_gguf), {**params, "model_alias": "tiny"})
    info = launch.ready(s)
    assert info.model == "tiny"
    assert 0 < info.load_s <= info.ready_s < READY_DEADLINE_S

    status, body = get(s.base + PRESET.models_path)
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["tiny"]

    # Streamed completion: one chunk per token (llama_cpp.server sends no usage
    # chunk in a stream, hence the preset's streams_usage=False), ends on length.
    events = stream(
        s.base + "/v1/completions",
        {"model": "tiny", "prompt": "hello world", "max_tokens": 16, "temperature": 0,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    texts = [e["choices"][0]["text"] for e in events if e["choices"] and e["choices"][0]["text"]]
    assert 1 <= len(texts) <= 16
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e or e["usage"] is None for e in events)

    # Plain completion: usage counts are consistent (EOS is never drawn by the tiny model).
    out = post(
        s.base + "/v1/completions",
        {"model": "tiny", "prompt": "hello world", "max_tokens": 24, "temperature": 0},
    )
    usage = out["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    # Concurrent streams all finish: the preset turns off interrupt_requests, which by
    # default cancels the running request when the next one arrives.
    with ThreadPoolExecutor(max_workers=3) as pool:
        body = {"model": "tiny", "prompt": "the server", "max_tokens": 48, "temperature": 0}
        runs = list(pool.map(lambda _: stream(s.base + "/v1/completions", body), range(3)))
    for events in runs:
        assert events[-1]["choices"][0]["finish_reason"] == "length"

    chat = stream(
        s.base + "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    )
    assert chat and chat[-1]["choices"][0]["finish_reason"] == "length"

    # The preset says this engine has no health or metrics endpoint: it really has none.
    assert PRESET.health_path is None and PRESET.metrics_path is None
    assert get(s.base + "/health")[0] == 404
    assert get(s.base + "/metrics")[0] == 404

    # A healthy start never trips a fatal pattern.
    assert match_fatal(s.log_path.read_text().splitlines(), PRESET.fatal_patterns) is None


@pytest.mark.parametrize(
    ("params", "model", "failure_class", "reason", "line"),
    [
        (
            {"bogus_flag": 3},
            None,
            FailureClass.INVALID_ARGS,
            "invalid_args",
            "unrecognized arguments: --bogus_flag 3",
        ),
        (
            {"n_ctx": -5},
            None,
            FailureClass.INVALID_ARGS,
            "invalid_args",
            "1 validation error for ModelSettings",
        ),
        (
            {},
            "/nonexistent/model.gguf",
            FailureClass.INVALID_ARGS,
            "model_not_found",
            "Model path does not exist: /nonexistent/model.gguf",
        ),
    ],
    ids=["unknown-flag", "bad-value", "missing-model"],
)
def test_rejected_start_is_classified_with_the_engines_message(
    launch: Any,
    tiny_gguf: Path,
    params: dict[str, Any],
    model: str | None,
    failure_class: FailureClass,
    reason: str,
    line: str,
) -> None:
    s = launch(model or str(tiny_gguf), params)
    with pytest.raises(TrialFailed) as caught:
        launch.ready(s)
    failed = caught.value
    assert failed.failure_class is failure_class
    evidence = failed.evidence
    assert evidence.reason == reason
    assert evidence.matched_line is not None and line in evidence.matched_line
    assert evidence.log_path == str(s.log_path)
    assert evidence.log_tail, "the evidence carries the end of the server log"
