"""Results databases of a few real sweeps of the simulated engine, kept as test data
(``tests/data/replay/*.db``), with what ``best --json`` and ``report --format json``
said of each when they were made (``*.best.json``, ``*.report.json``).
``tests/unit/test_replay_stores.py`` replays them: the decisions and the reports of
the same stores must stay the same whatever is moved around them.

The sweeps meet every decision a user meets: a winner, a tie, configurations screened
out, a predicted OOM skipped, an OOM at load (prediction off), the confirm phase's
rounds.

Remake (only on purpose: the golden outputs are what the test holds the code to):
    .venv/bin/python -m tests.helpers.replay_stores
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.sweep_helpers import run_cli, write_sweep

DATA = Path(__file__).resolve().parent.parent / "data" / "replay"

_CHAT = {"name": "chat", "concurrency": [2], "requests": 16, "max_tokens": 16, "ignore_eos": True}

SWEEPS: dict[str, dict[str, Any]] = {
    # a winner, two configurations screened out, a predicted OOM skipped, a failed start
    "screened": {
        "grid": {"step-ms": [2, 12, 16], "mem-per-gpu": ["40GiB", "100GiB"]},
        "workloads": [_CHAT],
        "extra": {
            "screening": {"requests": 4},
            "search": {"predict": "skip"},
            "objective": {"maximize": "output_throughput", "workload": "chat", "concurrency": 2},
            "constraints": ["chat.c2.ttft_p99_ms < 5000"],
        },
    },
    # two configurations of the same true performance (they differ in their seed) and a
    # slower one: a tie after the grid, then the confirm phase's rounds
    "confirmed": {
        "grid": {"seed": [1, 2], "step-ms": [4, 9]},
        "args": {"budget": 8, "topk": 4},
        "workloads": [
            {"name": "chat", "concurrency": [1, 2], "requests": 8, "max_tokens": 16,
             "ignore_eos": True}
        ],
        "extra": {"confirm": {"top": 3, "launches": 1, "budget": 2}},
    },
    # a winner decided beyond the uncertainty, and a configuration that was not predicted
    # (prediction off) and died of OOM while loading
    "failed": {
        "grid": {"step-ms": [2, 8], "mem-per-gpu": ["40GiB", "100GiB"]},
        "workloads": [
            {"name": "chat", "concurrency": [1, 4], "requests": 8, "max_tokens": 16,
             "ignore_eos": True}
        ],
        "extra": {
            "search": {"predict": "off"},
            "constraints": ["chat.c1.ttft_p99_ms < 5000"],
        },
    },
}  # fmt: skip


def make(name: str, directory: Path) -> None:
    spec = SWEEPS[name]
    sweep = write_sweep(
        directory,
        name=name,
        grid=spec["grid"],
        args=spec.get("args"),
        workloads=spec["workloads"],
        extra=spec["extra"],
    )
    done = run_cli("run", str(sweep), "--quiet", timeout=600)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{name}: run failed ({done.returncode}): {done.stderr}")
    shutil.copyfile(directory / "servesweep.db", DATA / f"{name}.db")
    for kind, args in (("best", ("best", "--json")), ("report", ("report", "--format", "json"))):
        copy = directory / "replay" / f"{name}.db"  # the kept file is never opened
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(DATA / f"{name}.db", copy)
        out = run_cli(*args[:1], str(copy), *args[1:])
        if out.returncode not in (0, 1):
            raise SystemExit(f"{name}: {kind} failed: {out.stderr}")
        (DATA / f"{name}.{kind}.json").write_text(out.stdout)


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:] or SWEEPS:
        with tempfile.TemporaryDirectory() as tmp:
            make(name, Path(tmp))


if __name__ == "__main__":
    main()
