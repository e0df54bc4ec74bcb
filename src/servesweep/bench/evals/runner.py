"""Run an eval workload against one server: ask, extract, check in the sandbox."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import aiohttp

from servesweep import metrics_catalog as mc
from servesweep.bench.evals.checkers import check_text
from servesweep.bench.evals.extract import extract_program, strip_reasoning
from servesweep.bench.evals.sandbox import Sandbox, SandboxLimits
from servesweep.bench.evals.suites import CodingTask, Task, TextTask, load_suite
from servesweep.bench.target import Target
from servesweep.decide.intervals import DEFAULT_CONFIDENCE
from servesweep.decide.level_intervals import eval_intervals
from servesweep.models import EvalTaskResult, LevelResult
from servesweep.spec.schema import EvalSpec, EvalWorkload

__all__ = ["CODING_INSTRUCTION", "build_request", "run_eval_workload"]

CODING_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function "
    "(and any imports it needs) in one ```python code block.\n\n"
)
_MAX_BODY = 400


def build_request(
    task: Task, workload: EvalWorkload, spec: EvalSpec, target: Target
) -> tuple[str, dict[str, Any]]:
    """``(path, JSON body)`` of the request asking ``task``."""
    body: dict[str, Any] = {
        "model": target.model,
        "temperature": spec.temperature,
        "max_tokens": spec.max_tokens,
        "stream": False,
    }
    if workload.endpoint == "completions":
        path = "/v1/completions"
        body["prompt"] = task.prompt
    else:
        path = "/v1/chat/completions"
        text = CODING_INSTRUCTION + task.prompt if isinstance(task, CodingTask) else task.prompt
        body["messages"] = [{"role": "user", "content": text}]
    body.update(target.request_extras)
    body.update(workload.extra_body)
    return path, body


def _answer_text(payload: Any, endpoint: str) -> str:
    choice = payload["choices"][0]
    if endpoint == "completions":
        return str(choice.get("text") or "")
    message = choice.get("message") or {}
    return str(message.get("content") or "")


async def _ask(
    session: aiohttp.ClientSession,
    target: Target,
    path: str,
    body: Mapping[str, Any],
    endpoint: str,
) -> tuple[str | None, str]:
    """The answer text, or None and why not (``http_500: ...``, ``timeout``...)."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        async with session.post(target.url(path), json=body, headers=headers) as resp:
            raw = await resp.read()
            if resp.status != 200:
                text = raw.decode("utf-8", "replace")[:_MAX_BODY]
                return None, f"http_{resp.status}: {text}"
            payload = await resp.json(content_type=None)
    except asyncio.TimeoutError:
        return None, f"timeout: no answer within {target.timeout_s:g} s"
    except aiohttp.ClientError as exc:
        return None, f"connection: {type(exc).__name__}: {exc}"
    except ValueError as exc:
        return None, f"bad_response: not JSON: {exc}"
    try:
        return _answer_text(payload, endpoint), ""
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        return None, f"bad_response: no choices[0] answer ({type(exc).__name__}: {exc})"


async def _one(
    task: Task,
    sample: int,
    session: aiohttp.ClientSession,
    sandbox: Sandbox,
    target: Target,
    workload: EvalWorkload,
    spec: EvalSpec,
    asking: asyncio.Semaphore,
) -> EvalTaskResult:
    path, body = build_request(task, workload, spec, target)
    async with asking:
        started = time.monotonic()
        answer, error = await _ask(session, target, path, body, workload.endpoint)
        asked = time.monotonic() - started

    def done(status: str, message: str = "", checked: float = 0.0) -> EvalTaskResult:
        """``seconds``: its own request and sandbox run, not time queued behind others."""
        return EvalTaskResult(task.task_id, sample, status, message, asked + checked)

    if answer is None:
        return done("error", error)
    if isinstance(task, TextTask):
        if not strip_reasoning(answer).strip():
            return done("no_answer", "empty answer")
        ok, why = check_text(task, answer)
        return done("pass" if ok else "fail", why)
    program = extract_program(answer, task.prompt, task.entry_point)
    if program is None:
        return done("no_answer", "no code in the answer")
    result = await sandbox.run(program, task.test, task.entry_point, prompt=task.prompt)
    return done(result.status, result.message, result.seconds)


async def run_eval_workload(
    target: Target,
    workload: EvalWorkload,
    *,
    sandbox: Sandbox | None = None,
    base_dir: str | None = None,
) -> LevelResult:
    """Run ``workload.eval`` against ``target``: every task ``samples`` times, answers
    checked (code in the sandbox, at most ``parallel`` at once). Request failures are
    data (status ``error``); raises :class:`DatasetError` for a bad suite and
    :class:`SandboxError` when generated code cannot be run safely here."""
    spec = workload.eval
    suite = load_suite(spec.suite, base_dir)
    tasks = suite.tasks[: spec.limit] if spec.limit else suite.tasks
    own = sandbox is None
    if sandbox is None:
        sandbox = Sandbox(
            SandboxLimits(timeout_s=spec.timeout),
            host_filesystem=spec.sandbox == "host-filesystem",
            backend="none" if spec.sandbox == "host-filesystem" else spec.sandbox,
            parallel=spec.parallel,
        )
    wall, started = time.time(), time.monotonic()
    try:
        if any(isinstance(t, CodingTask) for t in tasks):
            await sandbox.start()
        asking = asyncio.Semaphore(spec.parallel)
        timeout = aiohttp.ClientTimeout(total=target.timeout_s)
        connector = aiohttp.TCPConnector(limit=spec.parallel)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            jobs = [
                _one(task, sample, session, sandbox, target, workload, spec, asking)
                for task in tasks
                for sample in range(spec.samples)
            ]
            results = tuple(await asyncio.gather(*jobs))
    finally:
        if own:
            sandbox.close()
    seconds = time.monotonic() - started
    return _summarize(workload.name, suite.name, spec, results, sandbox, wall, seconds)


def _summarize(
    name: str,
    suite: str,
    spec: EvalSpec,
    results: tuple[EvalTaskResult, ...],
    sandbox: Sandbox,
    started_at: float,
    seconds: float,
) -> LevelResult:
    total = len(results)
    counts = Counter(r.status for r in results)
    passed = counts.get("pass", 0)
    errors = counts.get("error", 0)
    per_task: dict[str, dict[str, int]] = {}
    for r in results:
        entry = per_task.setdefault(r.task_id, {"passed": 0, "samples": 0})
        entry["samples"] += 1
        entry["passed"] += r.status == "pass"
    warnings = []
    if errors:
        first = next(r.message for r in results if r.status == "error")
        warnings.append(
            f"{errors} of {total} eval requests failed (first: {first[:200]}); they count "
            "as not passed — check the server log"
        )
    if sandbox.backend is not None:
        warnings.extend(sandbox.warnings)
    return LevelResult(
        workload=name,
        level="eval",
        repeat=0,
        metrics={
            mc.PASS_RATE.name: passed / total if total else 0.0,
            mc.PASSED.name: float(passed),
            mc.TOTAL.name: float(total),
            mc.EVAL_ERRORS.name: float(errors),
            mc.EVAL_ERROR_RATE.name: errors / total if total else 0.0,
        },
        warnings=tuple(warnings),
        intervals=eval_intervals(results, confidence=DEFAULT_CONFIDENCE),
        confidence=DEFAULT_CONFIDENCE,
        info={
            "suite": suite,
            "status_counts": dict(sorted(counts.items())),
            "per_task": per_task,
            "tasks": len(per_task),
            "samples": spec.samples,
            "sandbox": sandbox.backend or "not used",
            "sandbox_setting": spec.sandbox,
            **(
                {
                    "sandbox_memory_limit": sandbox.memory_limit,
                    "sandbox_nested_userns": "allowed" if sandbox.nested_userns else "blocked",
                    "sandbox_python": sandbox.python,
                }
                if sandbox.backend is not None
                else {}
            ),
        },
        started_at=started_at,
        duration_s=seconds,
        eval_results=results,
    )
