"""The correctness oracle over HTTP: known tasks answered right exactly as predicted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesweep.sim.oracle import oracle_correct
from servesweep.sim.testing import running_sim

TASKS = [
    {
        "task_id": "t/add",
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "entry_point": "add",
        "test": "def check(c):\n    assert c(1, 2) == 3\n",
        "reference": 'def add(a, b):\n    """Return a + b."""\n    return a + b\n',
    },
    {"task_id": "t/capital", "prompt": "Capital of Italy? One word.", "reference": "Rome"},
]


def test_oracle_answers_follow_oracle_correct(tmp_path: Path) -> None:
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    args = ["--load-time", "0", "--ttft-ms", "1", "--step-ms", "0.2", "--seed", "11"]
    args += ["--correct-rate", "0.5", "--oracle", str(task_file)]
    with running_sim(args, tmp_path) as sim:
        sim.wait_ready()
        for sample in range(6):
            code = sim.request(
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "Complete:\n" + TASKS[0]["prompt"]}]},
            ).json()["choices"][0]["message"]["content"]
            expected = oracle_correct(11, "t/add", sample, 0.5)
            assert code.startswith("```python\n") and code.endswith("```")
            assert ("return a + b" in code) == expected
            text = sim.request(
                "/v1/completions", {"prompt": f"Q: {TASKS[1]['prompt']}\nA:", "max_tokens": 50}
            ).json()["choices"][0]["text"]
            assert (text == "Rome") == oracle_correct(11, "t/capital", sample, 0.5)
        # Unknown prompts get ordinary generated text.
        other = sim.request("/v1/completions", {"prompt": "hello", "max_tokens": 3}).json()
        assert other["usage"]["completion_tokens"] == 3


def test_builtin_eval_tasks_are_known(tmp_path: Path) -> None:
    data = Path(__file__).parents[2] / "src/servesweep/bench/evals/data/text.jsonl"
    if not data.exists():
        pytest.skip("the eval task files are not in this checkout")
    first = json.loads(data.read_text().splitlines()[0])
    args = ["--load-time", "0", "--ttft-ms", "1", "--step-ms", "0.2", "--correct-rate", "1"]
    with running_sim(args, tmp_path) as sim:
        sim.wait_ready()
        reply = sim.request(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": first["prompt"]}]}
        ).json()
    assert reply["choices"][0]["message"]["content"] == first["reference"]
