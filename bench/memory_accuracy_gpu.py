"""How close the memory prediction comes to NVML with llama.cpp's CUDA llama-server.

For each configuration (``ctx-size``, ``parallel``, ``batch-size``, ``ubatch-size``,
the KV cache type, flash attention) over random-weight GGUFs of a few shapes
(tests/helpers/gguf_model.py, every layer on GPU 0), llama-server (the CUDA build:
``LLAMA_SERVER_CUDA_ARCH=90 dev/install-llama-server.sh``) is started with ``-lv 4``,
serves one prompt of up to a micro-batch and then ``parallel`` requests at once, and
is stopped. Meanwhile NVML is read every 50 ms (servesweep's probe): the most the
server's process held on the GPU is NVML's figure. Its buffer report (``model``,
``KV``, ``compute`` buffers on CUDA0) is read from its log with servesweep's parser.

Per model, the first configuration calibrates the predictor (servesweep's
``Calibrator``, as a sweep's first trial does: factors per component and the memory
no buffer report shows, NVML's figure less the report); every configuration is then
predicted again. Errors: weights and KV cache against the engine's report
(uncalibrated), the per-GPU total against NVML (uncalibrated and calibrated), and
whether the calibrated total is within the margin (the larger of 2 % and 256 MiB).

Run:  python3 bench/memory_accuracy_gpu.py --json [--out FILE] [--budget SECONDS]
      (LLAMA_SERVER_BIN names the CUDA build; needs one NVIDIA GPU and ~70 GiB free)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from servesweep.servers.gpu.nvml import NvmlProbe
from servesweep.servers.memory import MemoryModel, capacity_of
from servesweep.servers.memory.calibrate import Calibrator, MeasuredMemory, parse_memory_log
from servesweep.servers.memory.prediction import margin_for
from servesweep.servers.memory.rules import CUDA_CONTEXT
from servesweep.spec.schema import SweepSpec

MiB = 2**20
LONG = 1 << 20
SHAPES = {
    # 1.3 GiB of f32 weights, 128 KiB of f16 KV cache per token: totals 2-66 GiB
    "32x1024": TinyLlamaShape(
        n_embd=1024, n_layer=32, n_head=8, n_head_kv=8, n_ff=2048, context_length=LONG
    ),
    # 1.9 GiB of weights, 16 KiB of KV per token: the weights dominate
    "8x2048": TinyLlamaShape(
        n_embd=2048, n_layer=8, n_head=16, n_head_kv=4, n_ff=8192, context_length=LONG
    ),
    # 0.1 GiB: below 13 GiB the 256 MiB floor of the margin is the tolerance
    "4x1024": TinyLlamaShape(
        n_embd=1024, n_layer=4, n_head=16, n_head_kv=8, n_ff=2048, context_length=LONG
    ),
}


def _c(ctx: int, parallel: int, batch: int, ubatch: int, **extra: Any) -> dict[str, Any]:
    return {
        "ctx-size": ctx,
        "parallel": parallel,
        "batch-size": batch,
        "ubatch-size": ubatch,
        **extra,
    }


CONFIGS: dict[str, list[dict[str, Any]]] = {
    "32x1024": [
        _c(4096, 1, 2048, 512),  # calibrates
        _c(16384, 1, 2048, 512),
        _c(32768, 2, 1024, 256),
        _c(65536, 4, 2048, 512),
        _c(65536, 1, 4096, 4096),
        _c(131072, 4, 512, 128),
        _c(131072, 4, 2048, 512, **{"cache-type-k": "q8_0", "cache-type-v": "q8_0"}),
        _c(262144, 8, 2048, 512),
        _c(16384, 2, 2048, 512, **{"flash-attn": "off"}),
        _c(8192, 16, 512, 512),
        _c(524288, 4, 2048, 512),
    ],
    "8x2048": [
        _c(4096, 1, 2048, 512),  # calibrates
        _c(32768, 4, 2048, 512),
        _c(16384, 2, 256, 256),
        _c(65536, 8, 4096, 1024),
        _c(262144, 4, 512, 128),
        _c(1048576, 4, 2048, 512),
    ],
    "4x1024": [
        _c(4096, 1, 2048, 512),  # calibrates
        _c(65536, 4, 2048, 512),
        _c(8192, 2, 512, 128),
        _c(262144, 8, 4096, 2048),
    ],
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(model: Path) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "accuracy-gpu",
            "server": {
                "engine": "llama-server",
                "model": str(model),
                "gpus": [0],
                "gpu_backend": "nvml",
                "args": {"n-gpu-layers": 99, "log-verbosity": 4},
            },
            "workloads": [{"name": "chat"}],
        }
    )


class _Sampler:
    """NVML every 50 ms: the most one process held on GPU 0, and the GPU's used."""

    def __init__(self, probe: NvmlProbe, pid: int) -> None:
        self.probe, self.pid = probe, pid
        self.proc_max = self.used_max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> tuple[int, int]:
        state = self.probe.snapshot([0])[0]
        mine = sum(h.used_bytes for h in state.holders if h.pid == self.pid)
        return mine, state.used_bytes

    def _run(self) -> None:
        while not self._stop.is_set():
            mine, used = self.read()
            self.proc_max, self.used_max = max(self.proc_max, mine), max(self.used_max, used)
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _post(port: int, prompt: str, max_tokens: int) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


def run_once(
    binary: str, model: Path, config: dict[str, Any], log: Path, probe: NvmlProbe
) -> dict[str, Any]:
    """Start llama-server on GPU 0, serve a long prompt and ``parallel`` requests, stop."""
    port = _port()
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-ngl", "99", "-lv", "4"]
    for key, value in config.items():
        argv += [f"--{key}", str(value)]
    base = probe.snapshot([0])[0].used_bytes
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    sampler = _Sampler(probe, proc.pid)
    ready = served = False
    at_ready = (0, 0)
    error = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text(errors="replace")
            if "listening on http" in text or "server is listening" in text:
                ready = True
                break
            time.sleep(0.05)
        start_s = time.monotonic() - t0
        if ready:
            at_ready = sampler.read()
            seq = int(config["ctx-size"]) // int(config["parallel"])
            words = max(16, min(int(config["ubatch-size"]), seq // 2 - 32, 4096))
            try:
                _post(port, "hello " * words, 8)
                n = int(config["parallel"])
                with ThreadPoolExecutor(n) as pool:
                    list(pool.map(lambda _: _post(port, "write a short list", 16), range(n)))
                served = True
            except OSError as exc:
                error = f"request failed: {exc}"
            time.sleep(0.2)
        else:
            error = "did not listen"
    finally:
        sampler.stop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    # the next start measures from the memory this one gave back
    for _ in range(200):
        if probe.snapshot([0])[0].used_bytes <= base + 64 * MiB:
            break
        time.sleep(0.05)
    return {
        "ready": ready,
        "served": served,
        "error": error,
        "start_s": round(start_s, 2),
        "nvml_baseline": base,
        "nvml_process_ready": at_ready[0],
        "nvml_process_max": sampler.proc_max,
        "nvml_used_max_less_baseline": max(sampler.used_max - base, 0),
        "lines": log.read_text(errors="replace").splitlines(),
    }


def _err(got: float, real: float) -> float | None:
    return got / real - 1 if real else None


def measure(
    binary: str, tmp: Path, budget_s: float, out: Path | None, models: list[str]
) -> dict[str, Any]:
    deadline = time.monotonic() + budget_s
    probe = NvmlProbe()
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"binary": binary, "rows": rows, "skipped": []}
    for name in models:
        model = write_tiny_gguf(tmp / f"{name}.gguf", shape=SHAPES[name])
        spec = _spec(model)
        capacity = capacity_of(spec.server)
        result["capacity"] = {"bytes": capacity.bytes, "source": capacity.source}
        memory = MemoryModel.of_sweep(spec, capacity)
        calibrator = Calibrator("llama-server")
        for i, config in enumerate(CONFIGS[name]):
            if time.monotonic() > deadline:
                result["skipped"].append({"model": name, "config": config})
                continue
            raw = memory.predict(config)
            applied = memory.calibration
            run = run_once(binary, model, config, tmp / "server.log", probe)
            lines = run.pop("lines")
            parsed = parse_memory_log("llama-server", lines)
            row: dict[str, Any] = {"model": name, "config": config, **run}
            row["predicted"] = raw.to_json()
            row["calibrated_by"] = applied.trials
            if parsed is None:
                row["log_tail"] = lines[-30:]
                rows.append(row)
                continue
            nvml = run["nvml_process_max"] or run["nvml_used_max_less_baseline"]
            measured: MeasuredMemory = replace(parsed, device_used=nvml)
            row["reported"] = measured.to_json()
            row["reported_lines"] = list(parsed.lines)
            row["fit_lines"] = [x for x in lines if "projected to use" in x]
            row["attention_lines"] = [x for x in lines if "flash_attn" in x or "fattn" in x][:20]
            if i == 0:  # the sweep's first trial: it calibrates the rest
                memory.learn(calibrator.add(raw, measured, applied))
                row["calibration"] = asdict(memory.calibration)
            rows.append(row)
            if out is not None:
                out.write_text(json.dumps(result, indent=1), encoding="utf-8")
        uncalibrated = MemoryModel.of_sweep(spec, capacity)
        for row in rows:
            if row["model"] != name or "reported" not in row:
                continue
            first = uncalibrated.predict(row["config"]).to_json()
            cal = memory.predict(row["config"]).to_json()
            rep, nvml = row["reported"], row["reported"]["device_used"]
            row["calibrated"] = cal
            row["errors"] = {
                "weights": _err(first["weights"], rep["weights"]),
                "kv_cache": _err(first["kv_cache"], rep["kv_cache"]),
                "workspace": _err(first["workspace"] - CUDA_CONTEXT, rep["workspace"]),
                "total_uncalibrated": _err(first["per_gpu_bytes"], nvml),
                "total_calibrated": _err(cal["per_gpu_bytes"], nvml),
                "report_vs_nvml": _err(rep["per_gpu_bytes"], nvml),
            }
            row["tolerance"] = margin_for(nvml)
            row["within"] = abs(cal["per_gpu_bytes"] - nvml) <= margin_for(nvml)
    probe.close()
    if out is not None:
        out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def _table(result: dict[str, Any]) -> None:
    for row in result["rows"]:
        if "errors" not in row:
            why = row.get("error") or "no buffer report"
            print(f"{row['model']:<8} {json.dumps(row['config'])}: {why}")
            continue
        e, nvml = row["errors"], row["reported"]["device_used"]
        print(
            f"{row['model']:<8} {json.dumps(row['config'])}: NVML {nvml / MiB:.0f} MiB, "
            f"predicted {row['calibrated']['per_gpu_bytes'] / MiB:.0f} MiB "
            f"({e['total_calibrated']:+.2%}; uncalibrated {e['total_uncalibrated']:+.1%}), "
            f"weights {e['weights']:+.1%}, KV {e['kv_cache']:+.1%}, "
            f"within margin: {row['within']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, help="write the results here as they come")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds of launches")
    parser.add_argument("--models", default=",".join(SHAPES), help="comma-separated shapes")
    parser.add_argument("--configs", help="a JSON list of configurations for every model")
    args = parser.parse_args(argv)
    if args.configs:
        given = json.loads(args.configs)
        for name in CONFIGS:
            CONFIGS[name] = given
    binary = os.environ.get("LLAMA_SERVER_BIN", "")
    if not binary or not Path(binary).is_file():
        sys.exit("LLAMA_SERVER_BIN must name llama-server's CUDA build")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(binary, Path(tmp), args.budget, args.out, args.models.split(","))
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        _table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
