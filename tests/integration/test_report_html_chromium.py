"""The HTML report in a real browser (headless Chromium through Playwright), with its
Content-Security-Policy in force: no console message and no request, every chart
drawn, a hover explains the point under the mouse with its configuration, the
heatmap shows the stored results, and hostile text stays text."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.report_browser import CHROMIUM, Page, assert_charts_drawn, browser, open_report
from helpers.report_data import XSS, hostile_sweep, store_grid_sweep, throughput_sweep
from servesweep.decide.numbers import format_number
from servesweep.report import render
from servesweep.store import open_store

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


def _open(chromium: Any, html: str, path: Path, suffix: str = "") -> Page:
    path.write_text(html, encoding="utf-8")
    page = open_report(chromium, Path(str(path) + suffix) if suffix else path)
    return page


def _series_index(page: Page, chart: str, name: str) -> int:
    names: list[str] = page.js(
        "id => echarts.getInstanceByDom(document.getElementById(id)).getOption()"
        ".series.map(s => s.name)",
        chart,
    )
    return names.index(name)


def _data_index(page: Page, chart: str, series: int, trial: int) -> int:
    trials: list[int | None] = page.js(
        """([id, s]) => echarts.getInstanceByDom(document.getElementById(id)).getOption()
             .series[s].data.map(d => d && d.trial !== undefined ? d.trial : null)""",
        [chart, series],
    )
    return trials.index(trial)


def test_report_opens_without_console_messages_and_sorts(chromium: Any, tmp_path: Path) -> None:
    html = render(throughput_sweep(), "html")
    head = re.search(r'<table id="results".*?</thead>', html, re.S)
    assert head is not None
    column = re.findall(r"<th>(.*?)</th>", head.group(0)).index("output_throughput")
    page_path = tmp_path / "report.html"
    page_path.write_text(html, encoding="utf-8")
    page = open_report(chromium, page_path)
    assert page.messages == []
    page.page.goto(f"{page_path.as_uri()}#sort={column}-desc")
    page.page.reload()
    page.page.wait_for_function("document.documentElement.getAttribute('data-js') === 'ok'")
    values: list[str] = page.js(
        "c => Array.from(document.querySelectorAll('#results tbody tr'))"
        ".map(r => r.cells[c].textContent)",
        column,
    )
    numeric = [float(v) for v in values if v]
    assert numeric == sorted(numeric, reverse=True) and len(numeric) == 6
    assert values[len(numeric) :] == [""] * (len(values) - len(numeric))  # blanks last
    assert page.messages == []


def test_every_chart_is_drawn(chromium: Any, tmp_path: Path) -> None:
    page = _open(chromium, render(throughput_sweep(), "html"), tmp_path / "report.html")
    ids = assert_charts_drawn(page, tmp_path / "shots")
    assert set(ids) == {
        "chart-progress-trials", "chart-progress-gpu-hours", "chart-heatmap",
        "chart-effect-0", "chart-effect-1", "chart-parallel", "chart-tradeoff-0",
        "chart-per-gpu-0", "chart-timeline", "chart-memory",
    }  # fmt: skip
    assert page.messages == []


def test_blank_charts_are_detected(chromium: Any, tmp_path: Path) -> None:
    """The drawing check fails on a report whose charts lost their data."""
    html = render(throughput_sweep(), "html")
    found = re.search(r'(<script type="application/json" id="report-data">)(.*?)(</script>)',
                      html, re.S)  # fmt: skip
    assert found is not None
    payload = json.loads(found.group(2))
    for chart in payload["charts"]:
        for series in chart["option"]["series"]:
            series["data"] = []
    blank = html.replace(found.group(2), json.dumps(payload).replace("<", "\\u003c"))
    page = _open(chromium, blank, tmp_path / "blank.html")
    with pytest.raises(AssertionError, match=r"nothing drawn|chart is drawn|no data drawn"):
        assert_charts_drawn(page, tmp_path / "shots")


def test_hover_shows_the_configuration_of_a_known_point(chromium: Any, tmp_path: Path) -> None:
    page = _open(chromium, render(throughput_sweep(), "html"), tmp_path / "report.html")
    # the objective against budget, coloured by topk: trial 2 is budget=8 topk=4
    series = _series_index(page, "chart-effect-0", "topk=4")
    tip = page.hover_point("chart-effect-0", series, _data_index(page, "chart-effect-0", series, 2))
    for expected in ("#2 budget=8 topk=4", "budget = 8", "topk = 4", "outcome: ok",
                     "chat.c1.output_throughput = 150", "the best configuration", "chat.c1:",
                     "output_throughput = 150", "ttft_p99_ms = 200"):  # fmt: skip
        assert expected in tip, (expected, tip)
    assert "#1 " not in tip and "#3 " not in tip
    # the throughput-latency trade-off at c8: trial 3 (budget=12) is on the front
    series = _series_index(page, "chart-tradeoff-0", "c8")
    tip = page.hover_point(
        "chart-tradeoff-0", series, _data_index(page, "chart-tradeoff-0", series, 3)
    )
    assert "#3 budget=12 topk=6" in tip and "c8: 900 tok/s at tpot_median_ms 8" in tip, tip
    assert "on the c8 Pareto front" in tip and "chat.c8:" in tip
    assert page.messages == []


def _stored_objective(db: Path) -> dict[tuple[str, str], str]:
    """What each cell must show, straight from the database: the mean over repeats of
    chat c1 output throughput, the failure class of a failed trial, and 'infeasible'
    for a trial whose chat c8 TTFT p99 breaks the constraint (< 400)."""
    import sqlite3

    want: dict[tuple[str, str], str] = {}
    con = sqlite3.connect(db)
    try:
        for tid, params, outcome, failure in con.execute(
            "SELECT id, params, outcome, failure_class FROM trials"
        ):
            p = json.loads(params)
            key = (str(p["budget"]), str(p["topk"]))
            if outcome == "failed":
                want[key] = failure
                continue
            rows = con.execute(
                "SELECT level, metrics FROM results WHERE trial_id=?", (tid,)
            ).fetchall()
            c1 = [json.loads(m)["output_throughput"] for lv, m in rows if lv == "c1"]
            c8 = [json.loads(m)["ttft_p99_ms"] for lv, m in rows if lv == "c8"]
            text = format_number(sum(c1) / len(c1))
            want[key] = text + (" infeasible" if sum(c8) / len(c8) >= 400 else "")
    finally:
        con.close()
    return want


def test_heatmap_cells_equal_the_stored_results(chromium: Any, tmp_path: Path) -> None:
    db = store_grid_sweep(tmp_path / "servesweep.db")
    with open_store(db, readonly=True) as store:
        data = store.load_sweep_data()
    page = _open(chromium, render(data, "html"), tmp_path / "report.html")
    page.page.locator("#chart-heatmap").scroll_into_view_if_needed()
    cells: list[list[Any]] = page.js(
        """() => {
          const el = document.getElementById('chart-heatmap');
          const chart = echarts.getInstanceByDom(el);
          const o = chart.getOption(), box = el.getBoundingClientRect();
          return Array.from(el.querySelectorAll('svg text')).map(t => {
            const r = t.getBoundingClientRect();
            const at = chart.convertFromPixel({gridIndex: 0},
              [r.left + r.width / 2 - box.left, r.top + r.height / 2 - box.top]);
            return [at, t.textContent];
          }).filter(x => x[0] && x[1].trim() !== '');
        }"""
    )
    axes = page.js(
        """() => { const o = echarts.getInstanceByDom(document.getElementById('chart-heatmap'))
                     .getOption(); return [o.xAxis[0].data, o.yAxis[0].data]; }"""
    )
    shown: dict[tuple[str, str], list[str]] = {}
    for (xi, yi), text in cells:
        xi, yi = round(xi), round(yi)
        if 0 <= xi < len(axes[0]) and 0 <= yi < len(axes[1]):
            shown.setdefault((axes[0][xi], axes[1][yi]), []).append(text)
    want = _stored_objective(db)
    assert len(want) == 6
    labels = {k: " ".join(v) for k, v in shown.items() if k in want}
    # axis labels sit outside the cells; what is inside a cell is its label
    assert {k: labels.get(k, "").replace("\n", " ").split(" (")[0] for k in want} == want
    assert page.messages == []


def test_hostile_text_is_shown_as_text(chromium: Any, tmp_path: Path) -> None:
    page = _open(chromium, render(hostile_sweep(), "html"), tmp_path / "hostile.html")
    assert page.messages == []  # an injected script would be blocked, and logged
    assert page.page.title() == f"servesweep: {XSS}"  # nothing rewrote the title
    assert page.js("document.querySelectorAll('img, iframe, object, embed').length") == 0
    body: str = page.js("document.body.innerText")
    # in parameter values and names, in failure evidence, in server log lines
    for text in (XSS, f"Traceback {XSS}", f"line {XSS}", "</pre></details><script>alert(1)"):
        assert text in body, text
    scripts = page.js("Array.from(document.scripts).map(s => s.type || 'js')")
    assert scripts == ["application/json", "js", "js"]
    # a hover on a trial whose param value is hostile shows it as text too
    series = _series_index(page, "chart-effect-0", f"{XSS}=1")
    tip = page.hover_point("chart-effect-0", series, _data_index(page, "chart-effect-0", series, 1))
    assert f"mode = {XSS}" in tip and f"{XSS} = 1" in tip, tip
    assert page.js("document.querySelectorAll('img').length") == 0
    assert page.page.title() == f"servesweep: {XSS}" and page.messages == []
