"""The HTML report in a real browser: headless Chromium opens it with no console
message (no script error, no blocked request, no CSP violation), the sorting script
runs, hostile text runs nothing, and a screenshot shows data in every plot area."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.report_browser import CHROMIUM, Browser, console_lines, plots_drawn
from helpers.report_data import hostile_sweep, throughput_sweep
from servesweep.report import render

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    with Browser(tmp_path) as b:
        yield b


def _results_header(html: str) -> list[str]:
    table = html[html.index('<table id="results"') :]
    head = table[: table.index("</thead>")]
    return re.findall(r"<th>(.*?)</th>", head)


def test_report_opens_without_console_messages_and_sorts(browser: Browser, tmp_path: Path) -> None:
    html = render(throughput_sweep(), "html")
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    column = _results_header(html).index("output_throughput")
    dom, err = browser.run(f"{page.as_uri()}#sort={column}-desc", "--dump-dom")
    assert console_lines(err) == []
    assert 'data-js="ok"' in dom  # the script ran to its end
    body = dom[dom.index('<table id="results"') :]
    body = body[body.index("<tbody>") : body.index("</tbody>")]
    values = []
    for row in re.findall(r"<tr.*?</tr>", body, flags=re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
        values.append(cells[column])
    numeric = [float(v) for v in values if v]
    assert numeric == sorted(numeric, reverse=True) and len(numeric) == 6
    assert values[len(numeric) :] == [""] * (len(values) - len(numeric))  # blanks last


def test_hostile_text_runs_nothing_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "hostile.html"
    page.write_text(render(hostile_sweep(), "html"), encoding="utf-8")
    dom, err = browser.run(page.as_uri(), "--dump-dom")
    assert console_lines(err) == []  # an injected script would be blocked, and logged
    assert 'data-js="ok"' in dom
    assert "<title>servesweep: &lt;script&gt;" in dom
    assert "<img" not in dom and "pwned</title>" not in dom


def test_screenshot_plot_areas_are_not_blank(browser: Browser, tmp_path: Path) -> None:
    html = render(throughput_sweep(), "html")
    plots = plots_drawn(browser, html, tmp_path, tmp_path / "shot.png")
    assert {p["id"] for p in plots} == {
        "plot-objective-0",
        "plot-objective-1",
        "plot-pareto-0",
        "plot-timeline",
        "plot-memory",
    }


def test_blank_plots_are_detected(browser: Browser, tmp_path: Path) -> None:
    """The screenshot check fails on a report whose plots have lost their data."""
    html = render(throughput_sweep(), "html")
    marks = r'<(circle|path)[^>]*?(/>|>.*?</\1>)|<rect [^>]*fill="#[0-9a-f]{6}"><title>.*?</rect>'
    blank = re.sub(marks, "", html)
    with pytest.raises(AssertionError, match=r"plot area is drawn|no data drawn"):
        plots_drawn(browser, blank, tmp_path, tmp_path / "blank.png")
