"""How soon the readiness gate sees a server that listens before it can generate,
and how often it asks meanwhile (readiness.PollPolicy)."""

from __future__ import annotations

import re
import sys
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
    asked = _Asked(monkeypatch)
    launcher = SubprocessLauncher()
    loads = (1.0, 1.3, 1.6, 1.9, 2.2)
    with ThreadPoolExecutor(len(loads)) as pool:
        starts = list(pool.map(lambda t: _start(tmp_path, tracker, launcher, t), loads))
    delays = [max(asked.at[port]) - ready for port, ready, _ in starts]
    lags = [round(seen - ready, 3) for _, ready, seen in starts]
    assert max(delays) < 0.1, (
        f"asked {[round(d, 3) for d in delays]} s after ready (returned {lags} s after)"
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
