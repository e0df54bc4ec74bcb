"""Could the load generator keep time? One rule, applied to every measured level.

The generator measures its own health while it runs: the lag of its event loop
(``loop_lag_p99_ms``: how late its timer wakes up, so how late a chunk's timestamp
can be) and, for an arrival rate, how late it sent requests against their plan
(``schedule_lag_p99_ms``). Set against what the level measured:

* **unreliable** when the loop lag p99 is above ``UNRELIABLE_FLOOR_MS`` (5 ms) and
  above ``UNRELIABLE_TOKEN_SHARE`` (4) times the median time per token (ITL p50,
  else TPOT p50: chunks then pile up and the token timings are the generator's, not
  the server's) or above ``UNRELIABLE_TTFT_SHARE`` (0.5) of the median TTFT; or when
  a streamed level's time per token was measured as zero (every stream's tokens seen
  in one read: ITL or TPOT p50 of 0) while the loop lag p99 was above the 5 ms floor
  (the lag can have merged the chunks, so there is no time per token to judge it by);
  or when an arrival rate's schedule lag p99 is above 5 ms and above
  ``UNRELIABLE_ARRIVAL_SHARE`` (0.5) of the mean time between arrivals. The level is
  stored with the reason (``LevelResult.unreliable``); ``best``, constraints and
  pruning leave it out unless ``include_unreliable`` takes it in.
* **mild** when the loop lag p99 is above ``LAG_FLOOR_MS`` (2 ms) and above
  ``MILD_TOKEN_SHARE`` (0.1) of the time per token or ``MILD_TTFT_SHARE`` (0.05)
  of the TTFT, or a rate's schedule lag above 5 ms: the medians remain usable, the
  tails carry up to that lag. One warning per sweep says so.
* otherwise **ok**.

docs/metrics.md states the same rule for users.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from servesweep import metrics_catalog as mc
from servesweep.metrics_catalog import Latency, Stat, latency

__all__ = [
    "LAG_FLOOR_MS",
    "UNRELIABLE_FLOOR_MS",
    "UNRELIABLE_TOKEN_SHARE",
    "UNRELIABLE_TTFT_SHARE",
    "GeneratorHealth",
    "assess",
]

LAG_FLOOR_MS = 2.0
"""Below this lag (p99) the generator's timing is never questioned."""
UNRELIABLE_FLOOR_MS = 5.0
"""Below this lag (p99) a level is never unreliable (at most mild)."""
UNRELIABLE_TOKEN_SHARE = 4.0
UNRELIABLE_TTFT_SHARE = 0.5
UNRELIABLE_ARRIVAL_SHARE = 0.5
MILD_TOKEN_SHARE = 0.1
MILD_TTFT_SHARE = 0.05
MILD_SCHEDULE_MS = 5.0

State = Literal["ok", "mild", "unreliable"]

_PER_TOKEN = (("ITL", Latency.ITL), ("TPOT", Latency.TPOT))
"""The times per token a level can measure, in the order the rule reads them."""


@dataclass(frozen=True)
class GeneratorHealth:
    state: State
    reason: str = ""
    """One line: what lagged, against what (empty when ok)."""
    loop_lag_ms: float | None = None
    schedule_lag_ms: float | None = None

    def to_info(self) -> dict[str, Any]:
        """For the level's ``info["generator_health"]``."""
        out: dict[str, Any] = {"state": self.state}
        if self.reason:
            out["reason"] = self.reason
        if self.loop_lag_ms is not None:
            out["loop_lag_p99_ms"] = round(self.loop_lag_ms, 3)
        if self.schedule_lag_ms is not None:
            out["schedule_lag_p99_ms"] = round(self.schedule_lag_ms, 3)
        return out


def _positive(metrics: Mapping[str, float], name: str) -> float | None:
    value = metrics.get(name)
    return float(value) if value is not None and value > 0 else None


def assess(
    metrics: Mapping[str, float], *, rate: float | None = None, stream: bool = True
) -> GeneratorHealth:
    """The generator's health at one level (see the module doc); ``stream`` False for a
    level of whole answers, which has no time per token to measure."""
    loop = metrics.get(mc.LOOP_LAG_P99_MS.name)
    sched = metrics.get(mc.SCHEDULE_LAG_P99_MS.name) if rate is not None else None
    ttft = _positive(metrics, latency(Latency.TTFT, Stat.MEDIAN).name)
    token = _positive(metrics, latency(Latency.ITL, Stat.MEDIAN).name)
    token_name = "ITL"
    if token is None:
        token, token_name = _positive(metrics, latency(Latency.TPOT, Stat.MEDIAN).name), "TPOT"

    def health(state: State, reason: str = "") -> GeneratorHealth:
        return GeneratorHealth(state, reason, loop, sched)

    if loop is not None and loop > UNRELIABLE_FLOOR_MS:
        lagged = f"the load generator's event loop lagged {loop:.1f} ms (p99)"
        if token is not None and loop > UNRELIABLE_TOKEN_SHARE * token:
            return health("unreliable", f"{lagged} against a {token_name} p50 of {token:.2f} ms")
        if ttft is not None and loop > UNRELIABLE_TTFT_SHARE * ttft:
            return health("unreliable", f"{lagged} against a TTFT p50 of {ttft:.1f} ms")
        zero = [n for n, k in _PER_TOKEN if metrics.get(latency(k, Stat.MEDIAN).name) == 0]
        if stream and token is None and zero:
            return health(
                "unreliable",
                f"{lagged} while each stream's tokens arrived at once ({zero[0]} p50 of 0 ms)",
            )
    if rate is not None and rate > 0 and sched is not None and sched > MILD_SCHEDULE_MS:
        gap = 1000.0 / rate
        if sched > UNRELIABLE_ARRIVAL_SHARE * gap:
            return health(
                "unreliable",
                f"the load generator sent requests {sched:.1f} ms (p99) after their planned "
                f"time, against one arrival every {gap:.1f} ms",
            )
    if loop is not None and loop > LAG_FLOOR_MS:
        lagged = f"the load generator's event loop lagged {loop:.1f} ms (p99)"
        if token is not None and loop > MILD_TOKEN_SHARE * token:
            return health("mild", f"{lagged} against a {token_name} p50 of {token:.2f} ms")
        if ttft is not None and loop > MILD_TTFT_SHARE * ttft:
            return health("mild", f"{lagged} against a TTFT p50 of {ttft:.1f} ms")
    if sched is not None and sched > MILD_SCHEDULE_MS:
        return health("mild", f"the load generator sent requests {sched:.1f} ms (p99) late")
    return health("ok")
