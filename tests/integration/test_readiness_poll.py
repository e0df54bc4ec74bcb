"""How soon the readiness gate sees a server that listens before it can generate,
and how often it asks meanwhile (readiness.PollPolicy)."""

from __future__ import annotations

import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.integration.fixtures_lifecycle.helpers import HERE, Tracker, free_port, request, tracker

from servesweep.servers import http_probe, readiness
from servesweep.servers.engines import get_preset
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.readiness import wait_ready
from servesweep.sim.testing import read_truth
from servesweep.spec.schema import ServerSpec

__all__ = ["tracker"]

pytestmark = pytest.mark.integration

SIM = get_preset("sim")
CHATTY = str(HERE / "chatty_loader.py")


class _WakeLag:
    """How late this process's threads wake up while the test runs: a thread sleeping
    5 ms at a time records when it woke and how much later than asked (s). On a loaded
    machine the gate's own thread wakes that late too, after the ready line."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _WakeLag:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            before = time.monotonic()
            time.sleep(0.005)
            late = time.monotonic() - before - 0.005
            self.samples.append((time.time(), late))

    def worst(self, start: float, end: float) -> float:
        """The latest wake-up of the samples taken from ``start`` to ``end``."""
        return max((late for at, late in self.samples if start <= at <= end + late), default=0.0)


class _Asked:
    """When the gate began each attempt (its health request), per port
    (readiness.exchange, wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.at: dict[int, list[float]] = {}
        real = http_probe.exchange

        def recording(host: str, port: int, method: str, path: str, **kwargs: Any) -> Any:
            if path == SIM.health_path:
                self.at.setdefault(port, []).append(time.time())
            return real(host, port, method, path, **kwargs)

        monkeypatch.setattr(readiness, "exchange", recording)


def _start(
    tmp_path: Path, tracker: Tracker, launcher: SubprocessLauncher, load_time: float
) -> tuple[int, float, float]:
    """(port, the simulator's own ``ready`` time, the gate's return time)."""
    port = free_port()
    truth = tmp_path / f"truth-{port}.jsonl"
    params = {
        "load-time": load_time,
        "ttft-ms": 0,
        "truth": str(truth),
        "models-before-ready": True,
    }
    argv = SIM.build_argv(ServerSpec(engine="sim", port=port), params)
    log = tmp_path / f"sim-{port}.log"
    inst = tracker.track(launcher, launcher.start(request(argv, port, log, f"poll-{port}")))
    wait_ready(launcher, inst, SIM, host="127.0.0.1", port=port, model=None, deadline_s=30)
    seen = time.time()
    ready = [e["t"] for e in read_truth(truth) if e["event"] == "ready"]
    assert ready, log.read_text()
    return port, float(ready[-1]), seen


def test_a_server_that_loads_after_binding_is_asked_within_0_1_s_of_its_ready_line(
    tmp_path: Path, tracker: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The simulator binds first and answers 503 until its load ends (llama-server, an
    # API process in front of its workers): the gate had reached its 0.25 s back-off
    # long before, and asked again up to 0.27 s after the server could generate. Now
    # the ready line in its log makes the gate ask at once. What is measured is when
    # the gate began its last (successful) attempt, so the machine's load on the
    # request itself does not count. Five starts, staggered so that their ready
    # moments do not compete for the CPU. The previous policy asked at a moment
    # spread over 0.27 s after the ready line: all five within 0.1 s by chance is
    # about one in a hundred, more on a loaded machine, where a slow request can be
    # in flight when the server becomes ready (a negative delay here).
    # The bound is 0.1 s plus the worst wake-up delay of this process's threads in
    # the 0.1 s after each ready line: a few ms on an idle machine, so the old policy
    # still fails there.
    asked = _Asked(monkeypatch)
    launcher = SubprocessLauncher()
    loads = (1.0, 1.3, 1.6, 1.9, 2.2)
    with _WakeLag() as wake, ThreadPoolExecutor(len(loads)) as pool:
        starts = list(pool.map(lambda t: _start(tmp_path, tracker, launcher, t), loads))
    delays = [max(asked.at[port]) - ready for port, ready, _ in starts]
    lags = [round(seen - ready, 3) for _, ready, seen in starts]
    late = [wake.worst(ready, ready + 0.1) for _, ready, _ in starts]
    assert all(d < 0.1 + w for d, w in zip(delays, late, strict=True)), (
        f"asked {[round(d, 3) for d in delays]} s after ready (returned {lags} s after; "
        f"threads woke up to {[round(w, 3) for w in late]} s late then)"
    )


def test_an_access_log_does_not_make_the_gate_ask_a_loading_server_faster(
    tmp_path: Path, tracker: Tracker
) -> None:
    # Every request the gate makes is logged; those lines are not progress, or each
    # 503 would bring the next request forward (some 40 a second instead of 4).
    port = free_port()
    launcher = SubprocessLauncher()
    argv = [sys.executable, CHATTY, "--port", str(port), "--load-time", "2.5"]
    log = tmp_path / "chatty.log"
    inst = tracker.track(launcher, launcher.start(request(argv, port, log, "chatty-1")))
    info = wait_ready(launcher, inst, SIM, host="127.0.0.1", port=port, model=None, deadline_s=30)
    assert info.model == "chatty"
    found = re.search(r"ready after (\d+) requests while loading", log.read_text())
    assert found, log.read_text()
    # the back-off from 20 ms to 250 ms asks ~8 times in its first second, then 4/s:
    # some 14 in 2.5 s
    assert int(found.group(1)) <= 20, found.group(0)
