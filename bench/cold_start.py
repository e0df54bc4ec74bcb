"""The cold-start effect on a real engine: the first level measured after a launch
against the later ones, with ``warmup: 0`` and with ``warmup: auto``.

llama.cpp's CPU llama-server (dev/install-llama-server.sh) serves a random-weight
GGUF written here (tests/helpers/gguf_model.py, 8 layers of 512). Two sweeps of one
configuration, each measured in ``--launches`` separate launches (``launches: N``),
one load workload per launch: ``--repeats`` repeats of ``--requests`` streamed chat
requests (builtin:chat, ``max_tokens`` 32, ``ignore_eos`` so every request is as
long) at concurrency ``--concurrency``. Per launch, repeat 0 (the first measurement
after the launch; with ``warmup: auto`` the first after the warm-up) is set against
the mean of the later repeats of the same launch: output tokens/s and TTFT p50. With
``auto`` the table also gives the warm-up itself: windows, requests, seconds and its
first window's tokens/s per request against its last (the cold requests it absorbed).

Run:  .venv/bin/python bench/cold_start.py [--launches 4] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from servesweep.models import LevelResult
from servesweep.sim.testing import free_port
from servesweep.store import open_store

REPO = Path(__file__).resolve().parents[1]
SHAPE = TinyLlamaShape(n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1024)


def _binary() -> str:
    given = os.environ.get("LLAMA_SERVER_BIN")
    if given:
        return given
    done = subprocess.run(
        [str(REPO / "dev" / "install-llama-server.sh"), "--cached"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit("llama-server is not built: run dev/install-llama-server.sh")
    return done.stdout.strip().splitlines()[-1]


def _sweep(folder: Path, warmup: int | str, args: argparse.Namespace, binary: str,
           model: Path) -> Path:  # fmt: skip
    name = f"cold-{warmup}"
    spec: dict[str, Any] = {
        "name": name,
        "store": str(folder / f"{name}.db"),
        "server": {
            "engine": "llama-server",
            "executable": [binary],
            "model": str(model),
            "port": free_port(),
            "gpu_backend": "none",
            "args": {
                "threads": 2,
                "n-gpu-layers": 0,
                "alias": "tiny",
                "parallel": 2,
                "ctx-size": 2048,
            },
            "timeouts": {"stop": "10s", "ready": "120s", "request": "60s"},
            "log_dir": str(folder / f"{name}-runs"),
        },
        "params": {"points": [{"batch-size": 512}]},
        "workloads": [
            {
                "name": "chat",
                "dataset": "builtin:chat",
                "concurrency": [args.concurrency],
                "requests": args.requests,
                "max_tokens": 32,
                "ignore_eos": True,
                "repeats": args.repeats,
                "launches": args.launches,
                "warmup": warmup,
            }
        ],
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _run(path: Path) -> list[LevelResult]:
    done = subprocess.run(
        [sys.executable, "-m", "servesweep.cli.main", "run", str(path), "--quiet"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"servesweep run {path} failed:\n{done.stdout}\n{done.stderr}")
    with open_store(path.parent / f"{path.stem}.db", readonly=True) as store:
        data = store.load_sweep_data(with_samples=False)
    (trial,) = data.trials
    return list(data.results[trial.id])


def _summary(results: list[LevelResult]) -> dict[str, Any]:
    launches: dict[int, list[LevelResult]] = {}
    for res in results:
        launches.setdefault(res.launch, []).append(res)
    rows = []
    for launch, reps in sorted(launches.items()):
        reps.sort(key=lambda r: r.repeat)
        first, later = reps[0], reps[1:]
        row: dict[str, Any] = {"launch": launch}
        for metric in ("output_throughput", "ttft_median_ms", "tpot_median_ms"):
            row[f"first_{metric}"] = first.metrics[metric]
            row[f"later_{metric}"] = statistics.fmean(r.metrics[metric] for r in later)
        warm = first.info.get("warmup") or {}
        row["warmup"] = warm
        rows.append(row)

    def ratio(metric: str) -> list[float]:
        return [r[f"first_{metric}"] / r[f"later_{metric}"] for r in rows]

    out: dict[str, Any] = {"launches": rows}
    for metric in ("output_throughput", "ttft_median_ms", "tpot_median_ms"):
        values = ratio(metric)
        out[f"{metric}_first_over_later"] = {
            "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "each": values,
        }
    return out


def _table(name: str, summary: dict[str, Any]) -> str:
    lines = [
        f"### warmup: {name}",
        "",
        "| launch | first out tok/s | later out tok/s | first/later | first TTFT p50 ms "
        "| later TTFT p50 ms | warm-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary["launches"]:
        warm = row["warmup"]
        if warm.get("mode") == "auto":
            rates = [w.get("tokens_per_s") for w in warm["windows"]]
            said = (
                f"{len(warm['windows'])} windows, {warm['requests']} requests, "
                f"{warm['seconds']:.1f} s, stable {warm['stable']}, "
                f"tok/s per request {rates[0]} -> {rates[-1]}"
            )
        else:
            said = f"{warm.get('mode', 'not recorded')}"
        lines.append(
            f"| {row['launch']} | {row['first_output_throughput']:.1f} "
            f"| {row['later_output_throughput']:.1f} "
            f"| {row['first_output_throughput'] / row['later_output_throughput']:.3f} "
            f"| {row['first_ttft_median_ms']:.1f} | {row['later_ttft_median_ms']:.1f} | {said} |"
        )
    for metric in ("output_throughput", "ttft_median_ms"):
        r = summary[f"{metric}_first_over_later"]
        sd = "" if r["sd"] is None else f" (sd {r['sd']:.3f})"
        lines.append(f"\n{metric}: first / later = {r['mean']:.3f}{sd}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.repeats < 2:
        sys.exit("--repeats must be at least 2 (the first against the later ones)")
    binary = _binary()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="servesweep-cold-") as tmp:
        folder = Path(tmp)
        model = write_tiny_gguf(folder / "tiny.gguf", shape=SHAPE)
        for warmup in (0, "auto"):
            out[str(warmup)] = _summary(_run(_sweep(folder, warmup, args, binary, model)))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print("\n\n".join(_table(name, summary) for name, summary in out.items()))


if __name__ == "__main__":
    main()
