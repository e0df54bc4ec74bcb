"""The memory section of ``servesweep plan``: a prediction per trial (or, for a
sampling search, per configuration its space allows) as text and as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.models import ServerConfig
from servesweep.servers.memory import MemoryModel, MemoryPrediction
from servesweep.spec.plan import Plan
from servesweep.spec.schema import SweepSpec
from servesweep.spec.space import build_space

__all__ = ["PlannedMemory", "format_memory", "memory_json", "predict_plan"]

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class PlannedMemory:
    id: int
    config: ServerConfig
    prediction: MemoryPrediction


def predict_plan(
    spec: SweepSpec, plan: Plan, model: MemoryModel | None = None
) -> list[PlannedMemory]:
    """One prediction per trial of the plan; a sampling search: per configuration of
    its space when the space can be listed (none otherwise)."""
    model = model or MemoryModel.of_sweep(spec)
    if plan.search is None:
        configs = [t.config for t in plan.trials]
    else:
        space = build_space(spec.params)
        configs = space.allowed() if space.enumerable else []
    return [PlannedMemory(i, c, model.predict(c.params)) for i, c in enumerate(configs, start=1)]


def memory_json(planned: Sequence[PlannedMemory]) -> dict[str, Any]:
    return {
        "trials": [
            {
                "id": p.id,
                "params": dict(p.config.params),
                "predicted_memory": p.prediction.to_json(),
            }
            for p in planned
        ]
    }


def _size(n: int) -> str:
    if n == 0:
        return "-"
    if abs(n) >= 10 * GiB:
        return f"{n / GiB:.1f}G"
    if abs(n) >= GiB:
        return f"{n / GiB:.2f}G"
    return f"{n / MiB:.1f}M"


def format_memory(planned: Sequence[PlannedMemory], model: MemoryModel) -> str:
    """The memory table: per trial the components, the total per device, the capacity
    it is held against and the verdict; then what the capacity is and the margin."""
    cap = model.capacity
    where = "host" if cap.device == "host" else "per GPU"
    held = _size(cap.bytes) if cap.bytes else "unknown"
    lines = [
        f"memory ({model.engine}, predicted {where}; capacity {held} from "
        f"{cap.source or 'nowhere'}):"
    ]
    if not planned:
        lines.append("  (the search's space is too large to list: predicted as it proposes)")
        return "\n".join(lines)
    head = ("#", "weights", "kv_cache", "draft", "workspace", "total", "capacity", "verdict")
    rows = [head]
    notes: list[str] = []
    for p in planned:
        m = p.prediction
        verdict: str = m.verdict
        if m.verdict == "oom":
            verdict = "oom" if m.certain_oom else "oom (within margin)"
        rows.append(
            (
                str(p.id),
                _size(m.weights),
                _size(m.kv_cache),
                _size(m.draft),
                _size(m.workspace),
                _size(m.per_gpu_bytes) if m.verdict != "unknown" or m.per_gpu_bytes else "?",
                _size(m.capacity) if m.capacity else "?",
                verdict,
            )
        )
        if m.verdict != "fits" and m.reason:
            notes.append(f"  #{p.id}: {m.reason}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for row in rows:
        cells = [row[0].rjust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:-1], widths[1:-1], strict=True)]
        cells.append(row[-1])
        lines.append("  " + "  ".join(cells))
    margins = {p.prediction.margin for p in planned if p.prediction.verdict != "unknown"}
    if margins == {0}:
        lines.append("  margin 0: the fake GPUs count exactly what the engine asks for")
    elif margins:
        low, high = min(margins), max(margins)
        span = _size(low) if low == high else f"{_size(low)}-{_size(high)}"
        lines.append(
            f"  margin {span} (the larger of 2 % and 256 MiB); "
            "a configuration over its capacity by more than the margin is not launched"
        )
    fits = sum(p.prediction.verdict == "fits" for p in planned)
    oom = sum(p.prediction.verdict == "oom" for p in planned)
    unknown = len(planned) - fits - oom
    lines.append(f"  {fits} fit, {oom} predicted not to fit, {unknown} unknown")
    return "\n".join(lines + notes)
