"""How long after a server can generate the readiness gate sees it, per poll policy.

Each start launches the simulated engine (``servesweep sim``) and runs the readiness
gate on it; the simulator's ground truth (``--truth``) says when it became able to
generate (its ``ready`` event, written as it prints ``Application startup
complete.``). The lag is the gate's return minus that moment; it includes one real
generation read to its first token (the simulator's TTFT is set to 0 here). Two
shapes of server:

- ``binds when ready``: the port is bound only once the weights are loaded (vLLM,
  SGLang): the gate sees the listener and generates at once;
- ``binds, then loads``: the port answers from the start, ``/health`` 503 until the
  weights are loaded (llama-server, an API process in front of its workers): the
  gate must keep asking, and how often it asks is the policy.

Policies, run alternately in one process so that they share the machine's load:
``old`` (the gate before: after 37 ms, growing by 1.5x to 250 ms) and ``new``
(:data:`servesweep.servers.readiness.READY_POLL`: after 20 ms, growing to 250 ms,
and one attempt at most 50 ms after the previous one when a new line is logged).
``requests/s`` is how often the gate asked the loading server (health, model list or
generation) between its bind and its ready. ``asked`` is when the gate began its
last (successful) attempt, what the policy decides; ``seen`` adds the attempt itself
(health, model list, a generation to its first token), which costs CPU time.

Run:  .venv/bin/python bench/readiness_lag.py [--starts 5] [--load-time 1.5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servesweep.servers import http_probe, readiness
from servesweep.servers.engines import get_preset
from servesweep.servers.launchers.base import LaunchRequest
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.readiness import READY_POLL, PollPolicy, wait_ready
from servesweep.sim.testing import free_port, read_truth
from servesweep.spec.schema import ServerSpec

SIM = get_preset("sim")
POLICIES = {
    "old": PollPolicy(first_s=0.0375, max_s=0.25, log_gap_s=None),
    "new": READY_POLL,
}
SHAPES = {"binds when ready": False, "binds, then loads": True}


@dataclass
class Start:
    shape: str
    policy: str
    lag_s: float
    """The gate's return - the engine's ready (truth)."""
    asked_after_s: float
    """The start of the gate's last (successful) attempt - the engine's ready: what the
    poll policy decides, without the attempt's own time."""
    requests: int
    asked_s: float
    """Seconds between the bind (truth ``listening``) and the ready moment."""


class _Counter:
    """Counts the gate's HTTP exchanges (readiness.exchange, wrapped)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []
        """(when, path) of every request."""
        self._real = http_probe.exchange

    def __enter__(self) -> _Counter:
        def counted(host: str, port: int, method: str, path: str, **kwargs: Any) -> Any:
            self.calls.append((time.time(), path))
            return self._real(host, port, method, path, **kwargs)

        vars(readiness)["exchange"] = counted  # the name the gate calls
        return self

    def __exit__(self, *exc: object) -> None:
        vars(readiness)["exchange"] = self._real


def _event(truth: Path, pid: int, name: str) -> float:
    times = [e["t"] for e in read_truth(truth) if e["event"] == name and e.get("pid") == pid]
    if not times:
        raise RuntimeError(f"no {name!r} event of pid {pid} in {truth}")
    return float(times[-1])


def one_start(work: Path, shape: str, policy: str, load_time: float, n: int) -> Start:
    port = free_port()
    truth = work / f"truth-{n}.jsonl"
    spec = ServerSpec(engine="sim", port=port)
    params: dict[str, Any] = {"load-time": load_time, "ttft-ms": 0, "truth": str(truth)}
    if SHAPES[shape]:
        params["models-before-ready"] = True
    launcher = SubprocessLauncher()
    request = LaunchRequest(
        argv=SIM.build_argv(spec, params),
        env={},
        host="127.0.0.1",
        port=port,
        gpus=(),
        log_path=work / f"sim-{n}.log",
        trial_key=f"lag-{n}",
        fingerprint="lag",
    )
    inst = launcher.start(request)
    try:
        with _Counter() as counter:
            wait_ready(
                launcher,
                inst,
                SIM,
                host="127.0.0.1",
                port=port,
                model=None,
                deadline_s=60,
                poll=POLICIES[policy],
            )
            seen = time.time()
    finally:
        launcher.stop(inst, 2.0, 5.0)
    pid = inst.main_pid or 0
    ready = _event(truth, pid, "ready")
    listening = _event(truth, pid, "listening")
    asked = [t for t, _ in counter.calls if listening <= t <= ready]
    # every attempt begins with the health request
    last = max(t for t, path in counter.calls if path == SIM.health_path)
    return Start(shape, policy, seen - ready, last - ready, len(asked), max(0.0, ready - listening))


def _table(rows: list[Start]) -> str:
    head = (
        f"{'server':<18} {'policy':<6} {'starts':>6} {'asked ms after ready':>21} "
        f"{'seen ms after ready':>20} {'requests/s while loading':>25}"
    )
    lines = [head, f"{'':<32} {'mean / max':>21} {'mean / max':>20}"]
    for shape in SHAPES:
        for policy in POLICIES:
            rs = [r for r in rows if r.shape == shape and r.policy == policy]
            if not rs:
                continue
            asked_ms = [r.asked_after_s * 1000 for r in rs]
            lags = [r.lag_s * 1000 for r in rs]
            loading = sum(r.asked_s for r in rs)
            rate = f"{sum(r.requests for r in rs) / loading:.1f}" if loading > 0.05 else "-"
            lines.append(
                f"{shape:<18} {policy:<6} {len(rs):>6} "
                f"{f'{statistics.mean(asked_ms):.0f} / {max(asked_ms):.0f}':>21} "
                f"{f'{statistics.mean(lags):.0f} / {max(lags):.0f}':>20} {rate:>25}"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=5, help="starts per server shape and policy")
    p.add_argument("--load-time", type=float, default=1.5, help="the simulator's load, s")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines too")
    args = p.parse_args()
    rows: list[Start] = []
    with tempfile.TemporaryDirectory(prefix="servesweep-bench-") as tmp:
        n = 0
        for shape in SHAPES:
            for _ in range(args.starts):
                for policy in POLICIES:  # alternately: both see the same machine load
                    n += 1
                    rows.append(one_start(Path(tmp), shape, policy, args.load_time, n))
    print(
        f"readiness lag after the engine can generate: load {args.load_time:g}s, "
        f"{args.starts} starts per server shape and policy"
    )
    print(_table(rows))
    if args.json:
        for r in rows:
            print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
