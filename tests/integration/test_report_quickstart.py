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


def test_quickstart_output_has_one_untrusted_acceptance_note_per_workload(
    tmp_path: Path,
) -> None:
    """The quickstart's winner is decided on two metrics of one ignore_eos workload
    (chat.c1.output_throughput, chat.c8.ttft_p99_ms): the run's output and ``best``
    say once that its acceptance is untrusted, naming both (two configurations of its
    grid, to keep the test short)."""
    text = (ROOT / "examples" / "quickstart.yaml").read_text()
    text = re.sub(r"port: \d+", f"port: {free_port()}", text)
    text = re.sub(r"budget: \[[^]]*\]", "budget: [4, 8]", text)
    text = re.sub(r"topk: \[[^]]*\]", "topk: [1]", text)
    sweep_file = tmp_path / "quickstart.yaml"
    sweep_file.write_text(text)
    try:
        done = run_cli("run", str(sweep_file), timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        kill_tagged("quickstart", tmp_path)
    best = run_cli("best", str(sweep_file))
    assert best.returncode == 0, best.stderr
    for output in (done.stdout, best.stdout):
        notes = [line for line in output.splitlines() if "untrusted acceptance (?)" in line]
        assert len(notes) == 1, output
        assert "chat.c1.output_throughput, chat.c8.ttft_p99_ms" in notes[0]
