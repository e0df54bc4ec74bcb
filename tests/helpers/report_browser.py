"""Headless Chromium for the report tests, driven by Playwright: open a report as a
user would (its Content-Security-Policy in force), collect every console message and
page error, hover a chart's point, read what the page shows, take screenshots."""

from __future__ import annotations

import shutil
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
WIDTH = 1280
LOAD_TIMEOUT_MS = 60_000


@dataclass
class Page:
    """One opened report and what the browser said while showing it."""

    page: Any
    messages: list[str] = field(default_factory=list)
    """Console messages (any level) and uncaught page errors."""

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(expression, arg)

    def chart_ids(self) -> list[str]:
        ids: list[str] = self.js("Array.from(document.querySelectorAll('div.plot')).map(e => e.id)")
        return ids

    def hover_point(self, chart_id: str, series: int, data_index: int) -> str:
        """Move the mouse onto a data item of a chart (where ECharts drew it) and
        return the text of the tooltip that appears."""
        self.page.locator(f"#{chart_id}").scroll_into_view_if_needed()
        xy = self.js(
            """([id, s, i]) => {
              const chart = echarts.getInstanceByDom(document.getElementById(id));
              const item = chart.getOption().series[s].data[i];
              const value = Array.isArray(item) ? item : item.value;
              const p = chart.convertToPixel({seriesIndex: s}, value);
              const r = document.getElementById(id).getBoundingClientRect();
              return [r.left + p[0], r.top + p[1]];
            }""",
            [chart_id, series, data_index],
        )
        self.page.mouse.move(xy[0] + 40, xy[1] + 40)
        self.page.mouse.move(xy[0], xy[1], steps=4)
        tip = self.page.locator(f"#{chart_id} .tip").first
        tip.wait_for(state="visible", timeout=10_000)
        text: str = tip.inner_text()
        return text

    def screenshot(self, path: Path, selector: str | None = None) -> np.ndarray:
        if selector is None:
            self.page.screenshot(path=str(path), full_page=True)
        else:
            self.page.locator(selector).screenshot(path=str(path))
        return decode_png(path.read_bytes())


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium (the system's), closed afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


def open_report(chromium: Any, path: Path, height: int = 900) -> Page:
    """Open ``path`` and wait until the page's script ran to its end and every chart
    reported that it finished drawing."""
    page = chromium.new_page(viewport={"width": WIDTH, "height": height})
    opened = Page(page)
    page.on("console", lambda m: opened.messages.append(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: opened.messages.append(f"page error: {e}"))
    page.on("request", lambda r: _no_request(opened, r.url, path))
    page.goto(path.as_uri())
    page.wait_for_function(
        "document.documentElement.getAttribute('data-js') === 'ok' && "
        "document.documentElement.getAttribute('data-charts') === "
        "(document.documentElement.getAttribute('data-charts-drawn') || '0')",
        timeout=LOAD_TIMEOUT_MS,
    )
    return opened


def _no_request(page: Page, url: str, path: Path) -> None:
    if url != path.as_uri():
        page.messages.append(f"request: {url}")


def decode_png(data: bytes) -> np.ndarray:
    """RGB(A) 8-bit non-interlaced PNG -> array (height, width, channels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = channels = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        start = y * (stride + 1)
        kind_byte = raw[start]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=start + 1).copy()
        if kind_byte == 1:
            line = line.reshape(-1, channels).cumsum(axis=0, dtype=np.uint8).reshape(-1)
        elif kind_byte == 2:
            line = line + prev
        elif kind_byte in (3, 4):
            line = _sequential(line, prev, channels, kind_byte)
        out[y] = line
        prev = line
    return out.reshape(height, width, channels)


def _sequential(line: np.ndarray, prev: np.ndarray, ch: int, kind: int) -> np.ndarray:
    """Average and Paeth filters depend on the left neighbour: undo them bytewise."""
    cur = bytearray(line.tobytes())
    up = prev.tobytes()
    for i in range(len(cur)):
        a = cur[i - ch] if i >= ch else 0
        b = up[i]
        if kind == 3:
            cur[i] = (cur[i] + ((a + b) >> 1)) & 255
            continue
        c = up[i - ch] if i >= ch else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        cur[i] = (cur[i] + pred) & 255
    return np.frombuffer(bytes(cur), dtype=np.uint8)


def series_colors(page: Page, chart_id: str) -> list[tuple[int, int, int]]:
    """The colours the chart's option gives its series (data colours, not axes)."""
    hexes: list[str] = page.js(
        """id => {
          const o = echarts.getInstanceByDom(document.getElementById(id)).getOption();
          const out = o.series.map(s => s.color);
          o.series.forEach(s => out.push(s.itemStyle && s.itemStyle.color));
          (o.visualMap || []).forEach(v => (v.inRange && v.inRange.color || []).forEach(
            c => out.push(c)));
          return out.filter(c => typeof c === 'string');
        }""",
        chart_id,
    )
    return [(int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)) for c in hexes if len(c) == 7]


def assert_charts_drawn(page: Page, workdir: Path) -> list[str]:
    """Every chart of the page has an SVG with marks, and a screenshot of it (legends,
    colour scales and toolboxes hidden) shows its data: pixels close to one of its
    series' colours or the ends of its colour scale."""
    workdir.mkdir(parents=True, exist_ok=True)
    ids = page.chart_ids()
    assert ids, "the report has no chart"
    for chart_id in ids:
        marks = page.js(
            "id => document.querySelectorAll('#' + id + ' svg path, #' + id + ' svg rect').length",
            chart_id,
        )
        assert marks > 3, f"{chart_id}: nothing drawn ({marks} marks)"
        page.page.locator(f"#{chart_id}").scroll_into_view_if_needed()
        # legends, colour scales and toolboxes wear the series' colours too: hide them,
        # so that what is left in those colours is data
        page.js(
            """id => {
              const chart = echarts.getInstanceByDom(document.getElementById(id));
              const o = chart.getOption(), hide = {};
              for (const k of ['legend', 'visualMap', 'toolbox', 'dataZoom']) {
                if (o[k]) hide[k] = o[k].map(() => ({show: false}));
              }
              chart.setOption(hide);
            }""",
            chart_id,
        )
        image = page.screenshot(workdir / f"{chart_id}.png", f"#{chart_id}")
        rgb = image[:, :, :3].astype(np.int16).reshape(-1, 3)
        ink = np.any(rgb < 235, axis=1).mean()
        assert ink > 0.01, f"{chart_id}: only {ink:.2%} of the chart is drawn"
        colors = np.array(series_colors(page, chart_id), dtype=np.int16)
        assert len(colors), f"{chart_id}: no series colour to look for"
        close = np.abs(rgb[:, None, :] - colors[None, :, :]).max(axis=2) <= 30
        assert close.any(axis=1).sum() > 30, f"{chart_id}: no data drawn in its colours"
    return ids
