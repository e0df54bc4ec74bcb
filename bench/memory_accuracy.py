"""How close the memory prediction comes to what llama-server reports it allocated.

For each configuration (``ctx-size``, ``parallel``, ``batch-size``, ``ubatch-size``,
the KV cache type, flash attention) over random-weight GGUFs of a few shapes
(tests/helpers/gguf_model.py), llama-server (the CPU build, dev/install-llama-server.sh)
is started until it listens, then stopped; its buffer report (``model buffer size``,
``KV buffer size``, ``compute`` and ``output buffer size``) is read from its log with
servesweep's parser and compared with servesweep's prediction (``servesweep plan``'s,
uncalibrated). Prints the error per component (predicted / reported - 1).

Run:  .venv/bin/python bench/memory_accuracy.py [--json]   (LLAMA_SERVER_BIN or the cache)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from servesweep.servers.memory import Capacity, MemoryModel
from servesweep.servers.memory.calibrate import parse_memory_log
from servesweep.spec.schema import SweepSpec

SHAPES = {
    "8x512": TinyLlamaShape(n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1024),
    "4x1024": TinyLlamaShape(n_embd=1024, n_layer=4, n_head=16, n_head_kv=8, n_ff=2048),
}
CONFIGS: list[dict[str, Any]] = [
    {"ctx-size": c, "parallel": p, "batch-size": b, "ubatch-size": u}
    for c, p, b, u in itertools.product([1024, 8192], [1, 4], [64, 2048], [64, 512])
    if u <= b
] + [
    {"ctx-size": 4096, "parallel": 2, "cache-type-k": "q8_0", "cache-type-v": "q8_0"},
    {"ctx-size": 4096, "parallel": 2, "cache-type-k": "q4_0"},
    {"ctx-size": 4096, "parallel": 2, "flash-attn": "off"},
    {"ctx-size": 4096, "parallel": 2, "flash-attn": "on"},
]


def _binary() -> str:
    given = os.environ.get("LLAMA_SERVER_BIN")
    if given:
        return given
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [str(repo / "dev" / "install-llama-server.sh"), "--cached"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit("llama-server is not built: run dev/install-llama-server.sh")
    return done.stdout.strip().splitlines()[-1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flags(config: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in config.items():
        out += [f"--{key}", str(value)]
    return out


def run_once(binary: str, model: Path, config: dict[str, Any], log: Path) -> list[str]:
    """Start llama-server until it listens (its buffers are allocated by then)."""
    argv = [binary, "-m", str(model), "--port", str(_port()), "--host", "127.0.0.1"]
    argv += ["--threads", "2", "-ngl", "0", "-lv", "4", *_flags(config)]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text(errors="replace")
            if "listening on http" in text or "server is listening" in text:
                break
            time.sleep(0.05)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return log.read_text(errors="replace").splitlines()


def predict(model: Path, config: dict[str, Any]) -> dict[str, Any]:
    spec = SweepSpec.model_validate(
        {
            "name": "accuracy",
            "server": {"engine": "llama-server", "model": str(model), "gpu_backend": "none"},
            "workloads": [{"name": "chat"}],
        }
    )
    memory = MemoryModel.of_sweep(spec, Capacity(64 * 2**30, "host", "bench"))
    return memory.predict(config).to_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    binary = _binary()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            model = write_tiny_gguf(Path(tmp) / f"{name}.gguf", shape=shape)
            for config in CONFIGS:
                lines = run_once(binary, model, config, Path(tmp) / "server.log")
                measured = parse_memory_log("llama-server", lines)
                if measured is None:
                    print(f"{name} {config}: no buffer report in the log", file=sys.stderr)
                    continue
                got = predict(model, config)
                row: dict[str, Any] = {"model": name, "config": config}
                for part in ("weights", "kv_cache", "workspace"):
                    real = getattr(measured, part)
                    row[part] = {"predicted": got[part], "reported": real}
                    row[part]["error"] = got[part] / real - 1 if real else None
                rows.append(row)
    summary: dict[str, Any] = {}
    for part in ("weights", "kv_cache", "workspace"):
        errors = [abs(r[part]["error"]) for r in rows if r[part]["error"] is not None]
        summary[part] = {
            "configs": len(errors),
            "max_abs_error": max(errors) if errors else None,
            "mean_abs_error": sum(errors) / len(errors) if errors else None,
        }
    if args.json:
        json.dump({"rows": rows, "summary": summary}, sys.stdout, indent=2)
        print()
        return 0
    for row in rows:
        parts = "  ".join(
            f"{p} {row[p]['predicted'] / 2**20:.2f}/{row[p]['reported'] / 2**20:.2f} MiB "
            f"({row[p]['error']:+.1%})"
            for p in ("weights", "kv_cache", "workspace")
            if row[p]["error"] is not None
        )
        print(f"{row['model']:<7} {json.dumps(row['config'])}: {parts}")
    for part, s in summary.items():
        if s["configs"]:
            print(
                f"{part}: {s['configs']} configurations, |error| mean {s['mean_abs_error']:.1%}, "
                f"max {s['max_abs_error']:.1%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
