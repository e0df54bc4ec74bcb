"""The engines' own memory figures, read from their logs while they load, and the
calibration they give the predictor.

- llama.cpp (``llama-server``, llama-cpp-python): ``model buffer size``, ``KV buffer
  size``, ``compute buffer size`` and ``output buffer size`` lines, per device
  (``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``CUDA0``...); a second model's model and KV
  lines (the draft: after a second ``llama_model_loader: loaded meta data``) count as
  the draft, its compute and output buffers as workspace.
- vLLM: ``Model loading took X GiB``, ``Available KV cache memory: X GiB``, ``GPU KV
  cache size: N tokens``, ``Graph capturing finished ..., took X GiB``.
- SGLang: ``Load weight end. ... mem usage=X GB``, ``KV Cache is allocated. #tokens: N,
  K size: X GB, V size: Y GB``, ``Capture cuda graph end. ... mem usage=X GB``.

:class:`Calibrator` turns pairs of (prediction, measurement) into a
:class:`~servesweep.servers.memory.prediction.Calibration`: per component the mean of
measured / predicted over the trials so far (the KV cache per token, where both
sides know the tokens); for llama.cpp on a GPU whose probe read what the server held
(:attr:`MeasuredMemory.device_used`), the largest overhead beyond its buffer report
seen so far (the CUDA context, cuBLAS, the memory pool: what no buffer report shows).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep.servers.memory.prediction import Calibration, MemoryPrediction
from servesweep.servers.memory.rules import context_bytes as _context

__all__ = ["Calibrator", "MeasuredMemory", "parse_memory_log", "read_measured"]

_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_UNITS_BINARY = {"kb": 2**10, "mb": 2**20, "gb": 2**30}
"""SGLang and llama.cpp write GB/MiB for what torch and ggml count in binary units."""

_LLAMA_BUFFER = re.compile(
    r"(?P<device>[A-Za-z_]+\d*(?:_[A-Za-z]+)?)\s+(?P<kind>model|KV|compute|output|RS)\s+buffer"
    r"\s+size\s*=\s*(?P<size>[\d.]+)\s*(?P<unit>[KMG]i?B)"
)
_LLAMA_NEW_MODEL = re.compile(r"llama_model_loader: loaded meta data")
_VLLM_WEIGHTS = re.compile(r"Model loading took (?P<size>[\d.]+) ?(?P<unit>[KMG]i?B)")
_VLLM_KV = re.compile(r"Available KV cache memory: (?P<size>[\d.]+) ?(?P<unit>[KMG]i?B)")
_VLLM_TOKENS = re.compile(r"GPU KV cache size: (?P<tokens>[\d,]+) tokens")
_VLLM_GRAPHS = re.compile(r"Graph capturing finished .*?took (?P<size>[\d.]+) ?(?P<unit>[KMG]i?B)")
_SGL_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=(?P<size>[\d.]+) ?(?P<unit>[KMG]i?B)")
_SGL_KV = re.compile(
    r"KV Cache is allocated\. #tokens: (?P<tokens>\d+), K size: (?P<k>[\d.]+) ?(?P<ku>[KMG]i?B), "
    r"V size: (?P<v>[\d.]+) ?(?P<vu>[KMG]i?B)"
)
_SGL_GRAPHS = re.compile(
    r"Capture cuda graph end\..*?mem usage=(?P<size>[\d.]+) ?(?P<unit>[KMG]i?B)"
)
_MAX_LOG = 64 * 2**20


def _bytes(size: str, unit: str, binary: bool = False) -> int:
    key = unit.lower()
    scale = _UNITS_BINARY.get(key) if binary else None
    return int(float(size) * (scale or _UNITS[key]))


@dataclass(frozen=True)
class MeasuredMemory:
    """What the engine said it allocated, bytes per device (the largest device)."""

    engine: str
    weights: int = 0
    kv_cache: int = 0
    draft: int = 0
    workspace: int = 0
    kv_tokens: int = 0
    device: str = ""
    """The device the figures are of (``CPU``, ``CUDA0``, ``GPU``)."""
    host: int = 0
    """llama.cpp: bytes on the host beside the device's (the token embedding, the
    output buffer)."""
    lines: tuple[str, ...] = field(default_factory=tuple)
    """The log lines the figures come from."""
    device_used: int = 0
    """What the GPU's probe (NVML) saw the trial's server hold on that device while it
    served (0: not read). Beside the engine's figures it gives what no buffer report
    shows (the CUDA context, cuBLAS and the memory pool): :attr:`overhead`."""

    @property
    def reported(self) -> int:
        """The engine's own figures on the device, all components."""
        return self.weights + self.kv_cache + self.draft + self.workspace

    @property
    def overhead(self) -> int | None:
        """Device memory beyond the engine's buffer report (None: no device figure)."""
        if not self.device_used or self.device == "CPU":
            return None
        return max(self.device_used - self.reported, 0)

    @property
    def known(self) -> bool:
        return bool(self.weights or self.kv_cache)

    def to_json(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "draft": self.draft,
            "workspace": self.workspace,
            "kv_tokens": self.kv_tokens,
            "device": self.device,
            "host": self.host,
            "per_gpu_bytes": self.reported,
            "device_used": self.device_used,
        }

    @classmethod
    def from_json(cls, engine: str, data: Mapping[str, Any]) -> MeasuredMemory:
        """The figures back from :meth:`to_json` (without the log lines)."""
        return cls(
            engine=engine,
            weights=int(data.get("weights", 0)),
            kv_cache=int(data.get("kv_cache", 0)),
            draft=int(data.get("draft", 0)),
            workspace=int(data.get("workspace", 0)),
            kv_tokens=int(data.get("kv_tokens", 0)),
            device=str(data.get("device", "")),
            host=int(data.get("host", 0)),
            device_used=int(data.get("device_used", 0)),
        )


def _llama(lines: Iterable[str], engine: str) -> MeasuredMemory | None:
    models = 0
    main: dict[str, dict[str, int]] = {}
    draft: dict[str, int] = {}
    used: list[str] = []
    for line in lines:
        if _LLAMA_NEW_MODEL.search(line):
            models += 1
            continue
        match = _LLAMA_BUFFER.search(line)
        if not match:
            continue
        used.append(line.strip())
        device = match["device"]
        size = _bytes(match["size"], match["unit"], binary=True)
        base = "CPU" if device.startswith("CPU") else device
        if models > 1 and match["kind"] in ("model", "KV"):
            draft[base] = draft.get(base, 0) + size  # the draft's compute/output: workspace
            continue
        per = main.setdefault(base, {})
        per[match["kind"]] = per.get(match["kind"], 0) + size
    if not main:
        return None
    gpus = [d for d in main if d != "CPU" and not d.endswith("_Host")]
    device = max(gpus, key=lambda d: sum(main[d].values())) if gpus else "CPU"
    per = main[device]
    host = sum(main.get("CPU", {}).values()) + sum(
        sum(v.values()) for d, v in main.items() if d.endswith("_Host")
    )
    if device == "CPU":
        host = 0
    workspace = per.get("compute", 0) + per.get("output", 0) + per.get("RS", 0)
    return MeasuredMemory(
        engine=engine,
        weights=per.get("model", 0),
        kv_cache=per.get("KV", 0),
        draft=draft.get(device, 0),
        workspace=workspace,
        device=device,
        host=host,
        lines=tuple(used),
    )


def _vllm(lines: Iterable[str], engine: str) -> MeasuredMemory | None:
    weights = kv = tokens = graphs = 0
    used: list[str] = []
    for line in lines:
        for pattern in (_VLLM_WEIGHTS, _VLLM_KV, _VLLM_TOKENS, _VLLM_GRAPHS):
            match = pattern.search(line)
            if not match:
                continue
            used.append(line.strip())
            if pattern is _VLLM_TOKENS:
                tokens = int(match["tokens"].replace(",", ""))
            elif pattern is _VLLM_WEIGHTS:
                weights = _bytes(match["size"], match["unit"])
            elif pattern is _VLLM_KV:
                kv = _bytes(match["size"], match["unit"])
            else:
                graphs = _bytes(match["size"], match["unit"])
    if not (weights or kv):
        return None
    return MeasuredMemory(engine, weights, kv, 0, graphs, tokens, "GPU", lines=tuple(used))


def _sglang(lines: Iterable[str], engine: str) -> MeasuredMemory | None:
    weights = kv = tokens = graphs = 0
    used: list[str] = []
    for line in lines:
        if match := _SGL_WEIGHTS.search(line):
            weights = _bytes(match["size"], match["unit"], binary=True)
        elif match := _SGL_KV.search(line):
            tokens = int(match["tokens"])
            kv = _bytes(match["k"], match["ku"], True) + _bytes(match["v"], match["vu"], True)
        elif match := _SGL_GRAPHS.search(line):
            graphs = _bytes(match["size"], match["unit"], binary=True)
        else:
            continue
        used.append(line.strip())
    if not (weights or kv):
        return None
    return MeasuredMemory(engine, weights, kv, 0, graphs, tokens, "GPU", lines=tuple(used))


_PARSERS = {
    "llama-server": _llama,
    "llamacpp": _llama,
    "vllm": _vllm,
    "sglang": _sglang,
}


def parse_memory_log(engine: str, lines: Iterable[str]) -> MeasuredMemory | None:
    """The engine's memory figures in these log lines (None: none found, or an engine
    that prints none)."""
    parser = _PARSERS.get(engine)
    return parser(lines, engine) if parser is not None else None


def read_measured(engine: str, log_path: str | Path) -> MeasuredMemory | None:
    """:func:`parse_memory_log` of a trial's server log (None when unreadable)."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            text = log.read(_MAX_LOG)
    except OSError:
        return None
    return parse_memory_log(engine, text.splitlines())


def _ratio(measured: float, predicted: float) -> float | None:
    return measured / predicted if measured > 0 and predicted > 0 else None


@dataclass
class Calibrator:
    """Measured / predicted per component over a sweep's trials."""

    engine: str
    ratios: dict[str, list[float]] = field(default_factory=dict)
    overheads: list[int] = field(default_factory=list)
    trials: int = 0

    def add(
        self, predicted: MemoryPrediction, measured: MeasuredMemory, applied: Calibration
    ) -> Calibration:
        """One trial's pair; ``applied`` is the calibration its prediction was made
        with (the ratios are taken against the uncalibrated figures)."""
        if not measured.known:
            return self.calibration()
        self.trials += 1
        raw_weights = predicted.weights / applied.weights
        if self.engine == "vllm":  # "Model loading took" counts the draft's weights too
            raw_weights += predicted.draft / applied.weights
        raw_kv = predicted.kv_cache / applied.kv_cache
        pairs = {"weights": _ratio(measured.weights, raw_weights)}
        if measured.kv_tokens and predicted.kv_tokens:
            pairs["kv_cache"] = _ratio(
                measured.kv_cache / measured.kv_tokens, raw_kv / predicted.kv_tokens
            )
        else:
            pairs["kv_cache"] = _ratio(measured.kv_cache, raw_kv)
        if self.engine in ("llama-server", "llamacpp"):
            context = _context(applied) if predicted.device == "gpu" else 0
            raw_ws = (predicted.workspace - context) / applied.workspace
            pairs["workspace"] = _ratio(measured.workspace, raw_ws)
            overhead = measured.overhead if predicted.device == "gpu" else None
            if overhead is not None:
                self.overheads.append(overhead)
        elif self.engine == "vllm" and measured.weights and measured.kv_cache:
            # vLLM's share of the GPU less weights and KV cache: its activations,
            # sampler, CUDA graphs and context, all it does not report one by one
            context = _context(applied)
            rest = predicted.capacity - measured.weights - measured.kv_cache - context
            raw_ws = (predicted.workspace - context) / applied.workspace
            pairs["workspace"] = _ratio(rest, raw_ws)
        for name, value in pairs.items():
            if value is not None:
                self.ratios.setdefault(name, []).append(value)
        return self.calibration()

    def calibration(self) -> Calibration:
        def mean(name: str) -> float:
            values = self.ratios.get(name)
            return sum(values) / len(values) if values else 1.0

        return Calibration(
            weights=mean("weights"),
            kv_cache=mean("kv_cache"),
            workspace=mean("workspace"),
            overhead=max(self.overheads) if self.overheads else 0,
            trials=self.trials,
        )
