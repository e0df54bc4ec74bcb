"""Batching against one-at-a-time on vLLM's CPU build, as test_vllm_cpu measures it: the
flake of ``test_max_num_seqs_changes_throughput`` and its fix.

Each round runs the test's sweep of two configurations (``max-num-seqs 1``, then the
defaults; tests/integration/vllm_helpers.sweep_file: 8 streamed chat requests of 32
tokens at concurrency 4 on the tiny random-weight Llama) once per mode, alternately:

* ``before``: ``servesweep run`` in this script's session, as the test ran it before;
* ``after``: as the test runs it now: levels of 32 requests, ``servesweep run`` in a
  session of its own at the top CPU priority (nice -20) and each vLLM instance's
  session at nice -5 (vllm_helpers.favour_session, FavourInstances).

Per sweep: both levels' output tokens/s, their ratio (the test asserts default > 1.3 x
max-num-seqs 1), the load generator's event-loop lag p99 and TTFT p50 of the default's
level. ``--burners N`` keeps N ``while 1: pass`` processes (each in a session of its
own, as another user's work) running throughout; they are stopped by PID at the end.

``--live``: the same two levels, but against two instances started once (one per
configuration, kept running: a sweep costs two vLLM starts, minutes on 2 busy cores),
each round measuring both from a load generator process of the mode's session, the
instances' sessions set to the mode's priority first (the levels of a sweep are the
first after a start; here all but the first are warm).

Run:  .venv/bin/python bench/vllm_batching.py [--rounds 8] [--burners 2] [--live] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the vLLM tests' helpers

from tests.integration.sweep_helpers import SERVESWEEP, report_json
from tests.integration.vllm_helpers import (
    FIXED_ARGS,
    LEVEL_REQUESTS,
    SERVER_NICE,
    VENV,
    FavourInstances,
    favour_session,
    instance_groups,
    stop_group,
    sweep_file,
    tiny_model,
)

from servesweep.sim.testing import free_port

POINTS: list[dict[str, Any]] = [{"max-num-seqs": 1}, {}]
RATIO = 1.3
LEVEL = """
import json, sys
from servesweep.bench.standalone import BenchServer, bench_workload, run_standalone
workload = bench_workload(concurrency=[4], requests=int(sys.argv[1]), max_tokens=32,
                          ignore_eos=True, dataset="builtin:chat")
print(json.dumps([run_standalone(BenchServer(url=u), workload)[0].metrics
                  for u in sys.argv[2:]]))
"""


def _start(model: Path, point: dict[str, Any]) -> tuple[int, str]:
    """A vLLM instance of ``point`` (with the test's fixed flags), in a session of its
    own as servesweep starts one: its process group and URL, once /health answers."""
    port = free_port()
    argv = [str(VENV / "bin" / "vllm"), "serve", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--enforce-eager"]
    argv += ["--kv-cache-memory-bytes", str(FIXED_ARGS["kv-cache-memory-bytes"])]
    for key, value in point.items():
        argv += [f"--{key}", str(value)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                if answer.status == 200:
                    return proc.pid, url
        except OSError:
            time.sleep(1)
    stop_group(proc.pid)
    raise SystemExit(f"vLLM {point} did not start")


def _live(urls: list[str], groups: list[int], mode: str, requests: int) -> dict[str, Any]:
    for pgid in groups:  # the instances at the mode's priority
        if why := favour_session(pgid, SERVER_NICE if mode == "after" else 0):
            raise SystemExit(why)
    proc = subprocess.Popen(
        [sys.executable, "-c", LEVEL, str(requests), *urls],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=mode == "after",
    )
    unfavoured = favour_session(proc.pid) if mode == "after" else None
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(err[-1000:])
    one, default = json.loads(out)
    return _row(mode, one, default, unfavoured)


def _row(
    mode: str, one: dict[str, float], default: dict[str, float], unfavoured: str | None
) -> dict[str, Any]:
    a, b = one["output_throughput"], default["output_throughput"]
    return {
        "mode": mode,
        "one": round(a),
        "default": round(b),
        "ratio": round(b / a, 2),
        "passed": b > RATIO * a,
        "lag_p99_ms_one": round(one.get("loop_lag_p99_ms", -1)),
        "lag_p99_ms": round(default.get("loop_lag_p99_ms", -1)),
        "unfavoured": unfavoured,
    }


def _sweep(folder: Path, model: Path, mode: str, requests: int) -> dict[str, Any]:
    sweep = sweep_file(
        folder / "sweep.yaml",
        name=f"vllm-batching-{mode}",
        executable=[str(VENV / "bin" / "vllm"), "serve"],
        model=model,
        points=POINTS,
        requests=requests,
    )
    events = folder / "events.jsonl"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*SERVESWEEP, "run", str(sweep), "--quiet", "--events", str(events)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        start_new_session=mode == "after",
    )
    unfavoured = favour_session(proc.pid) if mode == "after" else None
    favour = FavourInstances(events, limit=1200)
    if mode == "after":
        favour.start()
    try:
        _, err = proc.communicate(timeout=1200)
    finally:
        favour.done.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        for pgid in instance_groups(events):
            stop_group(pgid)
    rows = sorted(report_json(sweep)["trials"], key=lambda r: r["seq"])
    levels = []
    for row in rows:
        if row["outcome"] != "ok":
            raise SystemExit(f"{mode}: trial {row['seq']} {row['outcome']}: {err[-500:]}")
        [result] = row["results"]
        levels.append(result)
    row = _row(mode, levels[0]["metrics"], levels[1]["metrics"], unfavoured)
    return {**row, "seconds": round(time.monotonic() - t0)}


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop what it started
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--modes", default="before,after")
    ap.add_argument("--requests", type=int, default=8, help="per level, before")
    ap.add_argument("--after-requests", type=int, default=LEVEL_REQUESTS, help="per level, after")
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    modes = args.modes.split(",")
    burners: list[subprocess.Popen[bytes]] = []
    groups: list[int] = []
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vllm-batching-") as tmp:
        model = tiny_model(VENV, Path(tmp))
        try:
            urls = []
            for point in POINTS if args.live else []:
                pgid, url = _start(model, point)
                groups.append(pgid)
                urls.append(url)
            for _ in range(args.burners):
                burners.append(
                    subprocess.Popen(
                        [sys.executable, "-c", "while 1: pass"], start_new_session=True
                    )
                )
            for r in range(args.rounds):
                for mode in modes:
                    requests = args.after_requests if mode == "after" else args.requests
                    if args.live:
                        row = {"round": r, **_live(urls, groups, mode, requests)}
                    else:
                        folder = Path(tmp) / f"{r}-{mode}"
                        folder.mkdir()
                        row = {"round": r, **_sweep(folder, model, mode, requests)}
                    out.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            for pgid in groups:
                stop_group(pgid)
            for b in burners:
                b.kill()
                b.wait(10)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for mode in modes:
        rows = [r for r in out if r["mode"] == mode]
        failed = sum(not r["passed"] for r in rows)
        ratios = sorted(r["ratio"] for r in rows)
        lags = sorted(r["lag_p99_ms"] for r in rows)
        print(
            f"{mode}: {failed} of {len(rows)} failed; ratio {ratios[0]}-{ratios[-1]} "
            f"(median {ratios[len(ratios) // 2]}); default's loop lag p99 "
            f"{lags[0]}-{lags[-1]} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
