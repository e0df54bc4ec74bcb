"""Tables of release and load times from a GPU test run (dev/gpu-tests.sh).

    python bench/gpu_release.py RESULTS_DIR

RESULTS_DIR is the unpacked ``results.tar.gz`` that dev/gpu-tests.sh brings back
(one folder per test: ``report.json`` from ``servesweep report --format json``,
``monitor.json`` from the tests' NVML monitor, server logs under ``runs/``).
For every sweep it prints, per trial: outcome, servesweep's ``stop``/``release``/
``load`` phase seconds, and per GPU the seconds from the start of the ``stop``
phase until that GPU's used memory was back within 1 GiB of the sweep's baseline
(read from the NVML trace, sampled every 20 ms on change). It also prints the
naive restarts of the tensor-parallel test from ``summary.jsonl``. Numbers are
only read, never made up: a missing file gives a missing row.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

GiB = 2**30
_LOADED = re.compile(r"\[worker (\d+) pid \d+\] loaded: (.*)")


def _released_at(samples: list[dict[str, Any]], gpu: int, after: float, limit: int) -> float | None:
    for s in samples:
        if s["gpu"] == gpu and s["t"] >= after and s["used"] <= limit:
            return float(s["t"])
    return None


def _worker_load(folder: Path, log_path: str | None) -> str:
    """Each worker's own load time from the server log (found under ``folder/runs``
    when the results were unpacked elsewhere than where they were made)."""
    if not log_path:
        return ""
    if not Path(log_path).exists() and "/runs/" in log_path:
        log_path = str(folder / "runs" / log_path.split("/runs/", 1)[1])
    if not Path(log_path).exists():
        return ""
    parts = []
    for line in Path(log_path).read_text(errors="replace").splitlines():
        m = _LOADED.search(line)
        if m:
            values = dict(re.findall(r"(\w+)_s ([0-9]+\.[0-9]+)", m.group(2)))
            parts.append(f"w{m.group(1)} {float(values.get('load', 'nan')):.1f}s")
    return ", ".join(sorted(parts))


def _baseline(stored: dict[str, Any]) -> dict[int, int]:
    """The sweep's GPU baseline, ``{gpu: bytes}``: stored per machine (``{node: {gpu:
    bytes}}``, one machine here), or by an older servesweep as ``{gpu: bytes}``."""
    values = next(iter(stored.values()), {}) if stored else {}
    if not isinstance(values, dict):
        values = stored
    return {int(k): int(v) for k, v in values.items()}


def sweep_table(folder: Path) -> list[str]:
    report = json.loads((folder / "report.json").read_text())
    monitor_path = folder / "monitor.json"
    samples = json.loads(monitor_path.read_text()) if monitor_path.exists() else []
    gpus = sorted({int(s["gpu"]) for s in samples})
    env = report["sweep"]["environment"]
    baseline = _baseline(env.get("baseline_bytes") or {})
    columns = ["trial", "params", "outcome", "stop_s", "release_s", "load_s"]
    columns += [f"GPU {g} back after stop (s)" for g in gpus] + ["worker load"]
    lines = [f"### {folder.name} ({report['sweep']['name']})", ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for index, trial in enumerate(report["trials"]):
        ph = trial["phase_seconds"]
        stop_at = (trial.get("phase_started") or {}).get("stop")
        cells = []
        for g in gpus:
            at = None
            if stop_at is not None and index > 0:
                at = _released_at(samples, g, float(stop_at), baseline.get(g, 0) + GiB)
            cells.append("" if at is None else f"{at - float(stop_at):.3f}")
        params = " ".join(f"{k}={v}" for k, v in trial["params"].items())
        outcome = trial["outcome"] + (
            f" ({trial['failure_class']})" if trial["failure_class"] else ""
        )
        row = [
            str(trial["id"]),
            params,
            outcome,
            *(f"{ph[k]:.3f}" if k in ph else "" for k in ("stop", "release", "load")),
            *cells,
            _worker_load(folder, trial.get("log_path")),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def naive_table(summary: Path) -> list[str]:
    lines: list[str] = []
    for raw in summary.read_text().splitlines():
        data = json.loads(raw)
        if data.get("test") != "tp_naive":
            continue
        lines += [
            "### naive restarts (kill the front, fixed sleep, start)",
            "",
            f"restarts {data['restarts']}, collided {data['collided']}, "
            f"CUDA OOM {data['ooms']}, port in use {data['port_in_use']}",
            "",
            "| sleep_s | start | hold GiB/GPU | pinned GiB/worker | outcome | start to ready (s) "
            "| GPUs back after kill (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in data["rows"]:
            back = ", ".join(f"{g}: {v}" for g, v in r["release_from_stop_s"].items())
            lines.append(
                f"| {r['sleep_s']} | {r['index']} | {r['config']['hold-gib']} | "
                f"{r['config']['pinned-gib']} | {r['outcome']} | {r['start_to_ready_s']} | {back} |"
            )
        lines.append("")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    out: list[str] = []
    for folder in sorted(p for p in root.iterdir() if (p / "report.json").exists()):
        out += sweep_table(folder)
    if (root / "summary.jsonl").exists():
        out += naive_table(root / "summary.jsonl")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
