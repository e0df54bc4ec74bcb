"""What an eval workload sends: endpoint, prompt, sampling settings, extras."""

from __future__ import annotations

from servesweep.bench.evals import CodingTask, TextTask, build_request
from servesweep.bench.evals.runner import CODING_INSTRUCTION
from servesweep.bench.target import Target
from servesweep.spec.schema import EvalSpec, workload_spec

CODE = CodingTask(
    "c/0", "def f(x):\n    '''Twice x.'''\n", "f", "def check(candidate):\n    pass\n"
)
TEXT = TextTask("t/0", "Capital of France?", "exact", "Paris")
TARGET = Target("http://127.0.0.1:1", "m", request_extras={"top_k": 1})


def test_chat_request_for_a_coding_task() -> None:
    spec = EvalSpec(suite="builtin:coding", temperature=0.2, max_tokens=300)
    workload = workload_spec(name="w", eval=spec, extra_body={"seed": 7})
    path, body = build_request(CODE, workload, spec, TARGET)
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": CODING_INSTRUCTION + CODE.prompt}]
    assert body["temperature"] == 0.2 and body["max_tokens"] == 300
    assert body["stream"] is False and body["model"] == "m"
    assert body["top_k"] == 1 and body["seed"] == 7


def test_text_tasks_are_asked_as_written() -> None:
    spec = EvalSpec(suite="builtin:text")
    _, body = build_request(TEXT, workload_spec(name="w", eval=spec), spec, TARGET)
    assert body["messages"][0]["content"] == TEXT.prompt
    assert body["temperature"] == 0.0


def test_completions_endpoint_sends_the_raw_prompt() -> None:
    spec = EvalSpec(suite="builtin:coding")
    workload = workload_spec(name="w", endpoint="completions", eval=spec)
    path, body = build_request(CODE, workload, spec, TARGET)
    assert path == "/v1/completions" and body["prompt"] == CODE.prompt
    assert "messages" not in body
