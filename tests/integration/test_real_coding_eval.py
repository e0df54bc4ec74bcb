"""The coding eval on a real model's answers: llama-server (CPU) serving the trained
Qwen2.5-Coder-1.5B-Instruct, swept by servesweep without and with speculative
decoding (``spec-type: ngram-simple``: drafts looked up in the context, no draft
model, so the module fits CI's time on two cores).

The pass rate is reported with its interval, and speculation at temperature 0 keeps
every verdict: the same tasks pass and fail with and without drafting, while the
server's own log shows that drafts were generated and accepted in the speculative
trial only. The model comes from ``dev/fetch-models.sh qwen2.5-coder-1.5b``
(``dev/setup.sh --test`` fetches it; docs/real-models.md, docs/evals.md).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.integration.sweep_helpers import SERVESWEEP, report_json

from helpers.llama_server import cached_llama_server, llama_server_sweep
from servesweep.sim.testing import free_port

REPO = Path(__file__).resolve().parents[2]
FETCH = REPO / "dev" / "fetch-models.sh"
MODEL = "qwen2.5-coder-1.5b"
TASKS = 5
# llama-server's summary after each request that drafted
ACCEPTANCE = re.compile(r"draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


@pytest.fixture(scope="module")
def qwen_coder() -> Path:
    done = subprocess.run(
        [str(FETCH), "--path", MODEL], capture_output=True, text=True, timeout=120, check=False
    )
    path = Path(done.stdout.strip())
    if done.returncode != 0 or not path.is_file():
        pytest.skip(f"{MODEL} is not fetched here (run dev/fetch-models.sh {MODEL})")
    return path


def _kill_servers_on(port: int) -> None:
    """Every llama-server that servesweep started for this test (its instance tag in
    the environment, this test's own port on its command line), killed by PID: the
    launcher puts each in its own session, out of reach of servesweep's group."""
    for proc in psutil.process_iter(["pid"]):
        with suppress(psutil.Error, OSError):
            if "SERVESWEEP_INSTANCE" in proc.environ() and str(port) in proc.cmdline():
                proc.kill()


def _run(sweep: Path, port: int, timeout: float) -> tuple[int, str]:
    """``servesweep run`` in its own process group; whatever happens (a failure, the
    test's timeout), that group and the servers it started are killed by PID."""
    proc = subprocess.Popen(
        [*SERVESWEEP, "run", str(sweep), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    finally:
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
        _kill_servers_on(port)


@pytest.mark.timeout(1500)
def test_coding_eval_of_a_real_model_keeps_its_verdicts_under_speculation(
    tmp_path: Path, qwen_coder: Path
) -> None:
    port = free_port()
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name="real-eval",
        binary=cached_llama_server(),
        model=qwen_coder,
        port=port,
        points=[{}, {"spec-type": "ngram-simple"}],
        server_extra={
            "args": {"threads": 2, "n-gpu-layers": 0, "ctx-size": 2048, "alias": "qwen"},
            # an answer (at most 196 tokens here) takes 9 s on 2 idle cores, 2 min loaded
            "timeouts": {"stop": "10s", "ready": "180s", "request": "600s"},
        },
        workloads=[
            {
                "name": "coding",
                "eval": {
                    "suite": "builtin:coding",
                    "limit": TASKS,
                    "max_tokens": 256,
                    "temperature": 0.0,
                    "parallel": 1,
                },
            }
        ],
    )
    code, out = _run(sweep, port, timeout=1400)
    assert code == 0, out
    rows = report_json(sweep)["trials"]
    assert [row["outcome"] for row in rows] == ["ok", "ok"], [r["failure"] for r in rows]
    evals: list[dict[str, Any]] = []
    for row in rows:
        (result,) = [r for r in row["results"] if r["level"] == "eval"]
        evals.append(result)
        metrics = result["metrics"]
        verdicts = [task["status"] for task in result["eval_results"]]
        assert metrics["total"] == TASKS and metrics["errors"] == 0, (row["params"], verdicts)
        # every answer was a real program that the sandbox judged (none cut short)
        assert set(verdicts) <= {"pass", "fail"}, result["eval_results"]
        # the pass rate with its (Wilson) interval around it
        low, high = result["intervals"]["pass_rate"]
        assert 0.0 <= low <= metrics["pass_rate"] <= high <= 1.0, result["intervals"]
        assert high - low > 0
    plain, spec = ({t["task_id"]: t["status"] for t in e["eval_results"]} for e in evals)
    # a trained coder passes most of these tasks (the seed's 4/5 is the bar)
    assert evals[0]["metrics"]["pass_rate"] >= 0.8, evals[0]["eval_results"]
    # at temperature 0 drafting changes the speed, never a verdict
    assert len(plain) == TASKS and spec == plain
    assert evals[1]["metrics"]["pass_rate"] == evals[0]["metrics"]["pass_rate"]
    # ...and speculation really ran in the second trial, and only there
    assert "--spec-type ngram-simple" in rows[1]["launch_command"]
    assert "--spec-type" not in rows[0]["launch_command"]
    plain_log, spec_log = (Path(row["log_path"]).read_text(errors="replace") for row in rows)
    assert not ACCEPTANCE.search(plain_log)
    counts = [(int(a), int(g)) for a, g in ACCEPTANCE.findall(spec_log)]
    assert counts, spec_log[-2000:]
    assert sum(g for _, g in counts) > 0 and sum(a for a, _ in counts) > 0, counts
