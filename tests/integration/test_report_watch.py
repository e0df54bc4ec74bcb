"""servesweep report --watch against a real results database that another process
writes: the file is rewritten as trials finish, the page reloads itself while the
sweep runs (in headless Chromium) and stops once the sweep is finished."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sweep_helpers import SERVESWEEP

from helpers.report_browser import CHROMIUM, browser, open_report
from helpers.report_data import T0
from servesweep.models import LevelResult, Outcome, Phase, ServerConfig
from servesweep.report.html import render_html
from servesweep.store import open_store

SPEC = """\
name: watched
server: {engine: sim, gpus: [0]}
params:
  grid: {budget: [4, 8]}
workloads:
  - {name: chat, concurrency: [1], requests: 8}
"""


def _wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _finish(db: Path, index: int, t: float) -> None:
    with open_store(db) as store:
        sweep = store.latest_sweep()
        assert sweep is not None
        trial = store.trials(sweep.id)[index]
        store.begin_attempt(trial.id, t, None)
        store.enter_phase(trial.id, Phase.BENCH, t)
        store.add_result(
            trial.id,
            LevelResult("chat", "c1", 0, {"output_throughput": 100.0 + index}, started_at=t),
        )
        store.finish_trial(trial.id, Outcome.OK, t + 5)


def _payload(html: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def test_watch_rewrites_until_the_sweep_is_finished(tmp_path: Path) -> None:
    db = tmp_path / "servesweep.db"
    with open_store(db) as store:
        sweep = store.create_sweep("watched", "w.yaml", SPEC, "h", "0.1.0")
        store.sync_trials(sweep.id, [ServerConfig.of({"budget": b}) for b in (4, 8)])
    out = tmp_path / "report.html"
    proc = subprocess.Popen(
        [*SERVESWEEP, "report", str(db), "--format", "html", "--out", str(out), "--watch",
         "--interval", "0.1s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait("the first report", lambda: out.exists())
        assert _payload(out.read_text())["reload_s"] == 5  # live: the page reloads itself
        _finish(db, 0, T0)
        _wait("trial 1 in the report", lambda: '"outcome":"ok"' in out.read_text())
        assert proc.poll() is None  # still watching: the sweep is not finished
        _finish(db, 1, T0 + 10)
        with open_store(db) as store:
            store.finish_sweep(sweep.id, T0 + 20)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    final = out.read_text()
    assert _payload(final)["reload_s"] is None and 'id="live"' not in final
    assert "finished" in final and err.strip().splitlines()[-1].endswith(
        "2/2 trials done, sweep finished"
    )


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_live_page_reloads_itself_and_stops_when_finished(tmp_path: Path) -> None:
    db = tmp_path / "servesweep.db"
    with open_store(db) as store:
        sweep = store.create_sweep("watched", "w.yaml", SPEC, "h", "0.1.0")
        store.sync_trials(sweep.id, [ServerConfig.of({"budget": b}) for b in (4, 8)])
    _finish(db, 0, T0)
    out = tmp_path / "report.html"
    with open_store(db, readonly=True) as store:
        out.write_text(render_html(store.load_sweep_data(), reload_s=0.5), encoding="utf-8")
    with browser() as chromium:
        page = open_report(chromium, out)
        loads: list[float] = []
        page.page.on("load", lambda: loads.append(time.monotonic()))
        _wait("two reloads", lambda: page.page.wait_for_timeout(50) or len(loads) >= 2)
        with open_store(db) as store:
            store.finish_sweep(sweep.id, T0 + 20)
            finished = store.load_sweep_data()
        out.write_text(render_html(finished, reload_s=0.5), encoding="utf-8")
        # the next reload (one may have read the file before it was rewritten) shows it
        for _ in range(10):
            page.page.wait_for_event("load", timeout=30_000)
            page.page.wait_for_function("document.documentElement.getAttribute('data-js')")
            if page.js("JSON.parse(document.getElementById('report-data').textContent)"
                       ".reload_s === null && !document.getElementById('live')"):  # fmt: skip
                break
        else:
            raise AssertionError("the finished page never loaded")
        assert page.messages == []
