"""The speculative-decoding landscape on a GPU, measured in full by servesweep.

llama-server (CUDA) with a random-weight target and a tiny random-weight draft of the same
vocabulary; acceptance set by hand with ``--spec-synth-rates`` (unconditional per-position
acceptance, rate_i = a**i for i = 1..k), so the text cannot move it. For each acceptance
profile ``a`` and draft length ``k`` in 1, 2, 4, 8, 16 one launch, plus the no-draft baseline;
each launch measures output throughput at concurrency 1 and 4 and the engine's own
acceptance counters. The performance predictor (servesweep.decide.perf) is then judged
against these measurements: predicted from the first launches, compared with the rest
(bench/predict_gpu_landscape.py reads the stores this writes).

    python3 bench/gpu_spec_landscape.py OUT --binary LLAMA_SERVER --profiles 0.8 0.6 [--rehearsal]
                                        [--guided] [--level 1|4]

``--guided``: a sampling search guided by the prediction (``search.strategy: tpe``, the
draft lengths zipped with their rates, the baseline a point) instead of the listed order:
the baseline, the design's longest draft length, then what the prediction says can win.
``--level``: the concurrency whose output throughput is the objective (4 unless told; the
best draft length moves with it); another than 4 writes OUT/<profile>-c<level>.

Writes OUT/model/{target,draft}.gguf once, then OUT/<profile>/sweep.yaml and runs
``servesweep run`` and ``servesweep report --format json`` on it (OUT/<profile>/report.json).
``--rehearsal`` runs the same on the CPU with a tiny target (a check of the mechanics).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.gguf_model import TinyLlamaShape, write_tiny_gguf  # noqa: E402

from servesweep.sim.testing import free_port  # noqa: E402

DRAFT_LENGTHS = (1, 2, 4, 8, 16)
TARGET = TinyLlamaShape(n_embd=1536, n_layer=16, n_head=12, n_head_kv=4, n_ff=4096)
TARGET_REHEARSAL = TinyLlamaShape(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=512)
DRAFT = TinyLlamaShape()


def rates(a: float, k: int) -> str:
    return ",".join(f"{a**i:.6f}" for i in range(1, k + 1))


def profile_tag(a: float, level: int) -> str:
    """A profile's sweep at one objective level: its name's and its folder's tail
    (``0.8``; another level than 4: ``0.8-c1``)."""
    return f"{a}" if level == 4 else f"{a}-c{level}"


GUIDED: dict[str, Any] = {
    "search": {"strategy": "tpe", "seed": 0, "prune": False},
    "confirm": False,  # as the listed grid: no relaunches of tied leaders
}
"""The sweep file's search when ``--guided``: a sampling search (the prediction guides it),
every launch measured to its last level."""


def params(draft: Path, a: float, rehearsal: bool, guided: bool) -> dict[str, Any]:
    """The sweep's params: the no-draft baseline and one configuration per draft length.
    Listed: every configuration a point, launched in order by a grid. ``guided``: the
    draft lengths a grid of one value per drafter param times the draft length zipped
    with its rates, and the baseline a point (a search hands points out first)."""
    drafter = {
        "model-draft": str(draft),
        "spec-type": "draft-simple",
        "spec-draft-n-min": 0,
        "spec-draft-p-min": 0.0,
        "spec-draft-ngl": 0 if rehearsal else 99,
    }
    if guided:
        return {
            "grid": {k: [v] for k, v in drafter.items()},
            "zip": {
                "spec-draft-n-max": list(DRAFT_LENGTHS),
                "spec-synth-rates": [rates(a, k) for k in DRAFT_LENGTHS],
            },
            "points": [{}],
        }
    points: list[dict[str, Any]] = [{}]
    for k in DRAFT_LENGTHS:
        points.append({**drafter, "spec-draft-n-max": k, "spec-synth-rates": rates(a, k)})
    return {"points": points}


def sweep_file(
    out: Path,
    binary: str,
    target: Path,
    draft: Path,
    a: float,
    rehearsal: bool,
    guided: bool,
    level: int = 4,
) -> Path:
    spec: dict[str, Any] = {
        "name": f"gpu-spec-landscape-{profile_tag(a, level)}",
        "store": str(out / "servesweep.db"),
        "server": {
            "engine": "llama-server",
            "executable": [binary],
            "model": str(target),
            "port": free_port(),
            "gpus": [] if rehearsal else [0],
            "gpu_backend": "none" if rehearsal else "nvml",
            "args": {
                "-ngl": 0 if rehearsal else 99,
                "flash-attn": "off" if rehearsal else "on",
                "parallel": 4,
                "ctx-size": 8192,
                "seed": 1,
                "alias": "landscape",
            },
            "timeouts": {"stop": "30s", "kill": "10s", "release": "120s", "ready": "300s"},
            "release": {"tolerance": "1GiB", "settle": "300ms", "foreign_holders": "fail"},
            "log_dir": str(out / "runs"),
        },
        "params": params(draft, a, rehearsal, guided),
        # listed: the grid's predict-first policy over the draft lengths, in order;
        # guided: the sampling search guided by the prediction (the baseline point, the
        # design's longest draft length, then the predicted best), every launch measured
        # to its last level; what either skips is measured after by `run --no-predict`
        "search": {"predict": "skip"},
        "workloads": [
            {
                "name": "chat",
                "dataset": "synthetic",
                "input_tokens": 64,
                "ignore_eos": True,
                "concurrency": [1, 4],
                "requests": 8 if rehearsal else 16,
                "max_tokens": 32 if rehearsal else 192,
                "temperature": 0.0,
            }
        ],
        "objective": {"maximize": f"chat.c{level}.output_throughput"},
    }
    if guided:
        spec.update(GUIDED)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--profiles", type=float, nargs="+", default=[0.8, 0.6])
    ap.add_argument("--rehearsal", action="store_true")
    ap.add_argument(
        "--guided",
        action="store_true",
        help="a sampling search guided by the prediction instead of the listed order",
    )
    ap.add_argument(
        "--level",
        type=int,
        choices=(1, 4),
        default=4,
        help="the concurrency whose output throughput is the objective",
    )
    args = ap.parse_args()
    models = args.out / "model"
    models.mkdir(parents=True, exist_ok=True)
    target, draft = models / "target.gguf", models / "draft.gguf"
    t0 = time.monotonic()
    if not target.exists():
        write_tiny_gguf(target, seed=1, shape=TARGET_REHEARSAL if args.rehearsal else TARGET)
    if not draft.exists():
        write_tiny_gguf(draft, seed=2, shape=DRAFT)
    print(f"models ready in {time.monotonic() - t0:.1f}s", flush=True)
    servesweep = [sys.executable, "-m", "servesweep.cli.main"]
    rc = 0
    for a in args.profiles:
        out = args.out / f"a{profile_tag(a, args.level)}"
        sweep = sweep_file(
            out, args.binary, target, draft, a, args.rehearsal, args.guided, args.level
        )
        for label, extra in (("predict", []), ("all", ["--no-predict"])):
            t1 = time.monotonic()
            run = subprocess.run([*servesweep, "run", str(sweep), *extra], check=False)
            took = time.monotonic() - t1
            print(f"profile {a} ({label}): run rc={run.returncode} in {took:.0f}s", flush=True)
            rc = rc or run.returncode
            rep = subprocess.run(
                [*servesweep, "report", str(sweep), "--format", "json"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            name = "report.json" if label == "all" else "report-predict.json"
            (out / name).write_text(rep.stdout)
        try:
            data = json.loads(rep.stdout)
        except json.JSONDecodeError:
            print(rep.stderr[-2000:])
            continue
        for row in data.get("trials", []):
            print(json.dumps({k: row.get(k) for k in ("trial", "params", "outcome")})[:400])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
