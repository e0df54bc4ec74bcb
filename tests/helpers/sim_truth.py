"""The simulated engine's per-generation ground truth (``generation`` lines of its truth
file, docs/sim.md): when each chunk was due and when it was really emitted, on the
``time.monotonic()`` clock that clients stamp with too.

Timing tests compare a client against this truth instead of against the configured
numbers, so a loaded machine makes the margins wider (by the lag it measured) but
never makes a test pass or fail by chance.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.sim.testing import SimRun

RESOLUTION_S = 2e-6
"""The truth file rounds times to microseconds: sums of two may be off by this much."""


@dataclass(frozen=True)
class Generation:
    index: int
    arrival: float
    admitted: float
    due: tuple[float, ...]
    emitted: tuple[float, ...]
    """When the sim started to write each chunk."""
    written: tuple[float, ...]
    """When that write returned (the bytes were with the kernel)."""
    tokens: tuple[int, ...]

    @property
    def lateness(self) -> list[float]:
        """Seconds each chunk was emitted after its deadline (never negative)."""
        return [e - d for d, e in zip(self.due, self.emitted, strict=True)]

    @property
    def writing(self) -> list[float]:
        """Seconds each chunk's write took in the sim."""
        return [w - e for e, w in zip(self.emitted, self.written, strict=True)]

    @property
    def steps(self) -> list[float]:
        """Seconds between consecutive deadlines: the simulated decode steps."""
        return [b - a for a, b in zip(self.due, self.due[1:], strict=False)]


def generations(run: SimRun) -> dict[int, Generation]:
    """Every finished generation of this sim process, by index."""
    out: dict[int, Generation] = {}
    for line in run.events("generation"):
        g = _generation(line)
        out[g.index] = g
    return out


def _generation(line: dict[str, Any]) -> Generation:
    return Generation(
        index=int(line["index"]),
        arrival=float(line["arrival"]),
        admitted=float(line["admitted"]),
        due=tuple(line["due"]),
        emitted=tuple(line["emitted"]),
        written=tuple(line["written"]),
        tokens=tuple(line["tokens"]),
    )


def before_emitted(client_times: Sequence[float], truth: Generation) -> list[float]:
    """For each chunk, how long before the sim started to write it the client stamped
    it (s): never positive, a client cannot see what was not sent yet."""
    assert len(client_times) == len(truth.emitted), (len(client_times), truth)
    return [e - c for c, e in zip(client_times, truth.emitted, strict=True)]


def after_written(client_times: Sequence[float], truth: Generation) -> list[float]:
    """For each chunk, how long after the sim's write returned the client stamped it
    (s): the client's own stamping delay (negative when it read the bytes before the
    sim's write call returned)."""
    assert len(client_times) == len(truth.written), (len(client_times), truth)
    return [c - w for c, w in zip(client_times, truth.written, strict=True)]


LAG_INTERVAL_S = 0.001
"""How often the timing tests' clients sample their own event-loop lag."""


def lag_margin(lags_s: Sequence[float], floor_s: float = 0.001) -> float:
    """How late a client may stamp what it received, derived from the event-loop lag
    it measured meanwhile (``LoopLagMonitor(LAG_INTERVAL_S)``): ``floor_s`` (the
    loopback trip and parsing on an idle machine) plus the largest lag seen, plus what
    the monitor cannot see: a stall shorter than one sampling interval, and the 1 ms it
    subtracts for epoll's rounding."""
    return floor_s + (max(lags_s) if lags_s else 0.0) + LAG_INTERVAL_S + 0.001


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
