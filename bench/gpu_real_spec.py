"""The worked example's sweep (examples/real-spec-decode.yaml) on a GPU, with the model that
can be brought there: SmolLM2-135M-Instruct (98 MB) instead of the Qwen2.5-Coder pair
(1.6 GB, more than a GPU machine without registry access can be sent).

The example's grid, unchanged: draft length (``spec-draft-n-max``) x the draft's minimum
probability (``spec-draft-p-min``) beside the no-draft baseline, chat and coding workloads
and the coding eval. The draft is SmolLM2's own first layers with its output head
(self-speculation of the LayerSkip kind, ``tests/helpers/self_spec_draft.py``), since
SmolLM2 has no smaller sibling of its vocabulary here; an ngram point (no draft model)
is added. Target and draft on the GPU (``-ngl 99``), concurrency 1 and 4.

    python3 bench/gpu_real_spec.py OUT --binary LLAMA_SERVER --model SmolLM2.gguf [--cpu]

Writes OUT/sweep.yaml, runs ``servesweep run`` then ``servesweep report --format json``
(OUT/report.json) and ``servesweep best`` (OUT/best.txt). ``--cpu`` runs the same on the
CPU with fewer requests (a rehearsal of the mechanics, or a CPU-only comparison).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers.self_spec_draft import self_spec_draft  # noqa: E402
from servesweep.sim.testing import free_port  # noqa: E402

EXAMPLE = REPO / "examples" / "real-spec-decode.yaml"
DRAFT_LAYERS = 24
"""As the CPU tier (tests/integration/test_real_spec_llama.py): SmolLM2's first 24 of 30
layers are accepted often enough to compare settings."""


def sweep_file(out: Path, binary: str, model: Path, draft: Path, cpu: bool, sandbox: bool) -> Path:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    spec["name"] = "real-spec-decode-smollm2" + ("-cpu" if cpu else "-gpu")
    spec["store"] = str(out / "servesweep.db")
    server = spec["server"]
    server["executable"] = [binary]
    server["model"] = str(model)
    server["port"] = free_port()
    server["log_dir"] = str(out / "runs")
    if not cpu:
        server["gpus"] = [0]
        server["gpu_backend"] = "nvml"
    server["args"] = {
        "threads": 2 if cpu else 8,
        "n-gpu-layers": 0 if cpu else 99,
        "ctx-size": 4096,
        "parallel": 4,
        "alias": "smollm2",
        "seed": 1,
    }
    grid = spec["params"]["grid"]
    grid["spec-draft-model"] = [str(draft)]
    grid["spec-draft-ngl"] = [0 if cpu else 99]
    # SmolLM2 is no coder (about 1 of 5 coding tasks): the eval is measured and shown
    # (speculation must not change it), not a constraint as it is for the Qwen pair
    spec.pop("constraints", None)
    if not sandbox:
        spec["workloads"] = [w for w in spec["workloads"] if "eval" not in w]
    spec["params"]["points"] = [
        {},  # the no-draft baseline
        {"spec-type": "ngram-simple", "spec-ngram-simple-size-n": 3, "spec-ngram-simple-size-m": 8},
    ]
    for workload in spec["workloads"]:
        if "eval" in workload:
            continue
        workload["concurrency"] = [1, 4]
        workload["requests"] = 4 if cpu else 12
        workload["max_tokens"] = 32 if cpu else 128
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the sweep runs")
    args = ap.parse_args()
    servesweep = [sys.executable, "-m", "servesweep.cli.main"]
    deadline = time.monotonic() + args.budget if args.budget else None

    def sweep_run(path: Path) -> int:
        """``servesweep run``, interrupted like a user's Ctrl-C when the budget ends (it
        stops its server and keeps what it measured)."""
        child = subprocess.Popen([*servesweep, "run", str(path)])
        left = None if deadline is None else max(deadline - time.monotonic(), 1.0)
        try:
            return child.wait(timeout=left)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)
            return child.wait(timeout=120)

    t0 = time.monotonic()
    draft = self_spec_draft(args.model, DRAFT_LAYERS)
    print(f"draft {draft.name} ready in {time.monotonic() - t0:.1f}s", flush=True)
    sandbox = shutil.which("bwrap") is not None or shutil.which("unshare") is not None
    print(f"sandbox tool for the coding eval: {'yes' if sandbox else 'none (eval left out)'}")
    sweep = sweep_file(args.out, args.binary, args.model, draft, args.cpu, sandbox)
    t1 = time.monotonic()
    rc = sweep_run(sweep)
    if rc == 2 and sandbox:  # refused before any launch: e.g. no usable sandbox
        print("refused; again without the coding eval", flush=True)
        sweep = sweep_file(args.out, args.binary, args.model, draft, args.cpu, sandbox=False)
        rc = sweep_run(sweep)
    print(f"run rc={rc} in {time.monotonic() - t1:.0f}s", flush=True)
    for verb, name, extra in (
        ("report", "report.json", ["--format", "json"]),
        ("report", "report.txt", []),
        ("best", "best.txt", []),
    ):
        done = subprocess.run(
            [*servesweep, verb, str(sweep), *extra], capture_output=True, text=True, check=False
        )
        (args.out / name).write_text(done.stdout + done.stderr, encoding="utf-8")
    print((args.out / "best.txt").read_text(encoding="utf-8"))
    shutil.copy(sweep, args.out / "sweep-used.yaml")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
