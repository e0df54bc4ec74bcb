"""Speculative decoding acceptance: from the engine's Prometheus counters differenced
around a level, else estimated from the tokens per stream chunk.

Definition (vLLM's ``SpecDecodingLogging``, ``vllm/v1/spec_decode/metrics.py``):
``mean acceptance length = 1 + accepted_tokens / drafts`` — the tokens one target
forward pass emits per draft, the bonus token included.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "acceptance_from_counters",
    "counter_names",
    "estimate_from_chunks",
    "parse_counters",
    "parse_per_position",
]

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'(?:^|[{,])\s*position\s*=\s*"(\d+)"')
_MAX_POSITIONS = 64


def counter_names(counters: Mapping[str, str]) -> list[str]:
    """The Prometheus names to read for ``Target.spec_decode_counters`` (``emitted``
    too when the engine counts no accepted tokens: SGLang)."""
    wanted: tuple[str, ...] = ("accepted", "drafts", "draft_tokens", _GAUGE)
    if "accepted" not in counters:
        wanted += ("emitted",)
    return [v for k, v in counters.items() if k in wanted]


_GAUGE = "accept_length"
"""Key of an engine's own acceptance-length gauge (SGLang reports one) in
``Target.spec_decode_counters``; used when there are no accepted/drafts counters."""


def parse_counters(text: str, names: Sequence[str], *, mean: bool = False) -> dict[str, float]:
    """Sum of each wanted metric over all its label sets (several engines of a
    data-parallel server each report their own series); their mean with ``mean``."""
    wanted = set(names)
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            out[m.group(1)] = out.get(m.group(1), 0.0) + value
            seen[m.group(1)] = seen.get(m.group(1), 0) + 1
    if mean:
        return {k: v / seen[k] for k, v in out.items()}
    return out


def parse_per_position(text: str, name: str) -> dict[str, float]:
    """The counter ``name`` by its ``position`` label (accepted tokens per draft
    position), summed over its other labels: ``{"NAME#0": v0, "NAME#1": v1, ...}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = _LINE.match(line)
        if m is None or m.group(1) != name or m.group(2) is None:
            continue
        pos = _POSITION.search(m.group(2))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if pos is None or int(pos.group(1)) >= _MAX_POSITIONS or not math.isfinite(value):
            continue
        key = f"{name}#{int(pos.group(1))}"
        out[key] = out.get(key, 0.0) + value
    return out


def _per_position(
    name: str, before: Mapping[str, float], after: Mapping[str, float]
) -> list[float]:
    """Deltas of the per-position series in position order (a missing position: 0)."""
    prefix = f"{name}#"
    positions = [int(k[len(prefix) :]) for k in after if k.startswith(prefix)]
    if not positions:
        return []
    return [
        after.get(f"{prefix}{i}", 0.0) - before.get(f"{prefix}{i}", 0.0)
        for i in range(max(positions) + 1)
    ]


def acceptance_from_counters(
    counters: Mapping[str, str], before: Mapping[str, float], after: Mapping[str, float]
) -> tuple[float | None, dict[str, Any]]:
    """Acceptance length from counter deltas; None when the counters are missing or
    no draft happened during the level. ``after`` may hold the engine's own
    acceptance-length gauge (key ``accept_length``), used when there are no counters;
    ``detail["source"]`` says which."""
    acc_name = counters.get("accepted")
    drafts_name = counters.get("drafts")
    gauge = counters.get(_GAUGE)
    emitted_name = counters.get("emitted")
    if not acc_name and drafts_name and emitted_name and drafts_name in after:
        # SGLang counts verify calls and generated tokens of finished requests, not
        # accepted tokens: its own acceptance length is tokens / verify calls
        # (meta_info spec_accept_length), the prefill's token included.
        drafts = after[drafts_name] - before.get(drafts_name, 0.0)
        emitted = after.get(emitted_name, 0.0) - before.get(emitted_name, 0.0)
        seen = {"drafts": drafts, "emitted_tokens": emitted, "definition": "tokens/verify"}
        if drafts > 0 and emitted > 0:
            return emitted / drafts, {**seen, "source": "engine_counters"}
    if not acc_name or not drafts_name:
        if gauge and gauge in after and after[gauge] > 0:
            return after[gauge], {"source": "engine_gauge", "gauge": gauge}
        return None, {}
    if acc_name not in after or drafts_name not in after:
        return None, {"counters_missing": [n for n in (acc_name, drafts_name) if n not in after]}
    accepted = after[acc_name] - before.get(acc_name, 0.0)
    drafts = after[drafts_name] - before.get(drafts_name, 0.0)
    detail: dict[str, Any] = {"accepted_tokens": accepted, "drafts": drafts}
    dt_name = counters.get("draft_tokens")
    if dt_name and dt_name in after:
        draft_tokens = after[dt_name] - before.get(dt_name, 0.0)
        detail["draft_tokens"] = draft_tokens
        if draft_tokens > 0:
            detail["draft_acceptance_rate"] = accepted / draft_tokens
    per_pos_name = counters.get("accepted_per_pos")
    per_pos = _per_position(per_pos_name, before, after) if per_pos_name else []
    if per_pos and drafts > 0:
        # accepted at draft position i, per draft: falls with i (a draft's token is
        # accepted only after every token before it was)
        detail["accepted_per_position"] = per_pos
        detail["acceptance_rate_per_position"] = [round(a / drafts, 4) for a in per_pos]
    if drafts <= 0:
        return None, detail
    detail["source"] = "engine_counters"
    return 1.0 + accepted / drafts, detail


def estimate_from_chunks(chunk_tokens: Sequence[Sequence[int]]) -> float | None:
    """Mean tokens per decode chunk (each request's first chunk, the prefill's
    token, and its last chunk, possibly cut short by ``max_tokens``, left out).
    Equals the acceptance length only when the server streams one chunk per
    decode step; under load chunks of several steps may merge, so it is an
    upper-bound estimate."""
    total = 0
    n = 0
    for tokens in chunk_tokens:
        middle = tokens[1:-1]
        total += sum(middle)
        n += len(middle)
    return total / n if n else None
