"""The quickstart sweep, run for real on the simulated engine as a user runs it: it
prints the results and the best configuration, and gives an HTML report that headless
Chromium opens with no console message and whose plots are drawn."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import kill_tagged, run_cli

from helpers.report_browser import CHROMIUM, assert_charts_drawn, browser, open_report
from servesweep.sim.testing import free_port

ROOT = Path(__file__).parents[2]


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_quickstart_html_report_in_chromium(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "quickstart.yaml").read_text()
    sweep_file = tmp_path / "quickstart.yaml"
    sweep_file.write_text(re.sub(r"port: \d+", f"port: {free_port()}", text))
    try:
        done = run_cli("run", str(sweep_file), timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        kill_tagged("quickstart", tmp_path)
    assert "7 trials, 7 ok" in done.stdout
    assert "best (max chat.c1.output_throughput): #" in done.stdout
    assert "launch: " in done.stdout
    data = json.loads(run_cli("report", str(sweep_file), "--format", "json").stdout)
    throughput = {
        (t["params"]["budget"], t["params"]["topk"]): next(
            r["metrics"]["output_throughput"] for r in t["results"] if r["level"] == "c1"
        )
        for t in data["trials"]
    }
    # a real optimum: the best speculative configuration beats no speculation clearly
    assert max(throughput.values()) > 1.2 * throughput[(0, 1)]
    out = tmp_path / "report.html"
    made = run_cli("report", str(sweep_file), "--format", "html", "--out", str(out))
    assert made.returncode == 0, made.stderr
    html = out.read_text(encoding="utf-8")
    assert "<code>" in html and "--budget" in html  # the best configuration's launch command
    with browser() as chromium:
        page = open_report(chromium, out)
        ids = set(assert_charts_drawn(page, tmp_path / "shots"))
        assert page.messages == []
    assert {
        "chart-heatmap", "chart-effect-0", "chart-effect-1", "chart-parallel",
        "chart-tradeoff-0", "chart-per-gpu-0", "chart-timeline", "chart-progress-trials",
        "chart-progress-gpu-hours",
    } <= ids  # fmt: skip
    assert "chart-memory" in ids  # the fake GPUs' memory over the sweep
