"""Memory prediction: what a configuration will hold on each GPU before it is launched.

:class:`MemoryModel` is the sweep's predictor: it reads the model's files once
(:mod:`.facts`: GGUF header, config.json and safetensors headers), the capacity of
the trial's devices (:func:`capacity_of`: NVML, the fake GPUs, or the host's memory
for a CPU-only engine), and applies the engine's rules (:mod:`.rules`) to each
configuration; each measured trial (:mod:`.calibrate`: the engine's own memory figures
from its log) corrects it for the rest of the sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import psutil

from servesweep.errors import ConfigError, ServesweepError
from servesweep.servers.memory.facts import ModelFacts, ModelFilesUnreadable, read_model_facts
from servesweep.servers.memory.prediction import (
    COMPONENTS,
    Calibration,
    Capacity,
    MemoryPrediction,
    Verdict,
    margin_for,
)
from servesweep.servers.memory.rules import RULES, Params, TrialShape, predict
from servesweep.spec.schema import ServerSpec, SweepSpec
from servesweep.spec.slots import GpuNeed, gpu_need

__all__ = [
    "COMPONENTS",
    "Calibration",
    "Capacity",
    "MemoryModel",
    "MemoryPrediction",
    "ModelFacts",
    "ModelFilesUnreadable",
    "Verdict",
    "capacity_of",
    "margin_for",
    "read_model_facts",
]

_CPU_ENGINES = ("llamacpp", "llama-server")
_NEEDS_FILES = ("llamacpp", "llama-server", "vllm", "sglang", "trtllm")
_DRAFT_PARAMS = (
    "speculative-config.model",
    "speculative-draft-model-path",
    "model-draft",
    "md",
    "spec-draft-model",
    "draft-model",
)


def _cpu_only(server: ServerSpec) -> bool:
    return server.engine in _CPU_ENGINES and (not server.gpus or server.gpu_backend == "none")


def capacity_of(server: ServerSpec) -> Capacity:
    """Memory of one of the trial's devices: the smallest GPU of the pool (fake GPUs or
    NVML); the host's memory for llama.cpp without GPUs. Never raises: an unreadable
    device is a capacity of None with the reason in ``source``."""
    if _cpu_only(server):
        return Capacity(psutil.virtual_memory().total, "host", "host memory")
    if server.gpu_backend == "none":
        return Capacity(None, "gpu", "gpu_backend none")
    from servesweep.servers.gpu import open_probe

    if server.fake_gpus is not None and server.fake_gpu_dir:
        from pathlib import Path

        if not Path(server.fake_gpu_dir).exists():
            return Capacity(server.fake_gpus.memory, "gpu", "server.fake_gpus")
    try:
        probe = open_probe(server.gpu_backend, server.fake_gpu_dir, gpus=server.gpus or None)
        try:
            states = probe.snapshot(server.gpus or None)
            name = probe.name
        finally:
            probe.close()
    except ServesweepError as exc:
        return Capacity(None, "gpu", f"GPUs not readable: {exc}")
    if not states:
        return Capacity(None, "gpu", "no GPU seen")
    source = "fake GPUs" if name == "fake" else name.upper() if name == "nvml" else name
    return Capacity(min(s.total_bytes for s in states), "gpu", source)


class MemoryModel:
    """The predictor of one sweep: model files read once, calibrated as trials measure."""

    def __init__(
        self, server: ServerSpec, capacity: Capacity | None = None, need: GpuNeed | None = None
    ) -> None:
        self.server = server
        self.capacity = capacity if capacity is not None else capacity_of(server)
        self.calibration = Calibration()
        self._facts: dict[str, ModelFacts | str] = {}
        self._need = need

    @classmethod
    def of_sweep(cls, spec: SweepSpec, capacity: Capacity | None = None) -> MemoryModel:
        """The predictor of a sweep (its GPUs per trial from ``server.gpus_per_trial``)."""
        try:
            need: GpuNeed | None = gpu_need(spec)
        except ConfigError:
            need = None
        return cls(spec.server, capacity, need)

    @property
    def engine(self) -> str:
        return self.server.engine

    def _read(self, model: str, model_config: str | None = None) -> ModelFacts | str:
        key = f"{model}\0{model_config or ''}"
        if key not in self._facts:
            try:
                self._facts[key] = read_model_facts(model, model_config)
            except ConfigError as exc:
                self._facts[key] = f"model files not readable: {exc.message}"
        return self._facts[key]

    def merged(self, params: Mapping[str, Any]) -> dict[str, Any]:
        from servesweep.servers.engines import get_preset, merged_params_over

        preset = get_preset(self.engine)
        return merged_params_over(merged_params_over(preset.default_args, self.server.args), params)

    def predict(
        self, params: Mapping[str, Any], calibration: Calibration | None = None
    ) -> MemoryPrediction:
        """The prediction for one configuration (its swept params), with
        ``calibration`` (None: the one the model has learned so far)."""
        from servesweep.servers.engines import expand_model

        merged = Params(self.merged(params))
        facts: ModelFacts | None = None
        error = ""
        if self.engine in _NEEDS_FILES:
            model = merged.get("model", "model-path") or self.server.model
            if not model and not self.server.model_config_file:
                error = "no server.model to read (set server.model_config to its config.json)"
            else:
                try:
                    path = expand_model(str(model)) if model else ""
                except ConfigError as exc:
                    path, error = "", exc.message
                if not error:
                    got = self._read(path, self.server.model_config_file)
                    facts, error = (got, "") if isinstance(got, ModelFacts) else (None, got)
        draft: ModelFacts | None = None
        draft_error = ""
        draft_path = merged.get(*_DRAFT_PARAMS)
        if draft_path and self.engine in _NEEDS_FILES:
            got = self._read(str(draft_path))
            draft, draft_error = (got, "") if isinstance(got, ModelFacts) else (None, got)
        gpus = 0 if _cpu_only(self.server) else self._gpus(params)
        shape = TrialShape(
            engine=self.engine,
            params=merged,
            gpus=gpus,
            capacity=self.capacity,
            model=facts,
            model_error=error,
            draft=draft,
            draft_error=draft_error,
            calibration=self.calibration if calibration is None else calibration,
        )
        prediction = predict(shape)
        if prediction.verdict == "unknown" and not prediction.capacity and self.capacity.bytes:
            prediction = replace(prediction, capacity=self.capacity.bytes)
        return prediction

    def _gpus(self, params: Mapping[str, Any]) -> int:
        if self._need is None:
            return max(len(self.server.gpus), 1)
        try:
            return self._need.of(params)
        except ConfigError:
            return max(len(self.server.gpus), 1)

    @property
    def supported(self) -> bool:
        return self.engine in RULES

    def learn(self, calibration: Calibration) -> None:
        """Use ``calibration`` for every later prediction."""
        self.calibration = calibration
