"""Headless Chromium for the report tests: run it safely, read console messages,
decode its PNG screenshots (zlib + struct + numpy) and check that plots are drawn."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from servesweep.report.svg import PALETTE

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--enable-logging=stderr",
    "--v=0",
]
WIDTH = 1280


class Browser:
    """Runs headless Chromium, each run in its own process group, killed if left."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.groups: list[int] = []

    def run(self, url: str, *args: str, timeout: float = 120.0) -> tuple[str, str]:
        profile = self.root / f"profile-{len(self.groups)}"
        proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.groups.append(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc.pid)
            proc.communicate()
            raise
        return out, err

    @staticmethod
    def _kill(pgid: int) -> None:
        """SIGKILL what is left of a browser we started: the processes still in its
        process group (checked one by one in /proc, so nothing else is touched)."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:  # field 5 of /proc/PID/stat: the process group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(stat.parent.name), signal.SIGKILL)

    def close(self) -> None:
        for pgid in self.groups:
            self._kill(pgid)  # renderer or GPU helpers that outlived the browser

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def console_lines(stderr: str) -> list[str]:
    """Console messages Chromium logged (script errors, CSP violations, blocked loads)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


_GEOMETRY = """<script>
window.addEventListener("load", function () {
  var out = [];
  document.querySelectorAll("svg.plot").forEach(function (svg) {
    var r = svg.querySelector("rect.frame").getBoundingClientRect();
    out.push({id: svg.id, x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height});
  });
  var pre = document.createElement("pre");
  pre.id = "geometry";
  pre.textContent = JSON.stringify({plots: out, height: document.documentElement.scrollHeight});
  document.body.appendChild(pre);
});
</script>"""


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


def _palette_rgb() -> np.ndarray:
    return np.array(
        [(int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)) for c in PALETTE], dtype=np.int16
    )


def plots_drawn(browser: Browser, html: str, workdir: Path, shot: Path) -> list[dict[str, Any]]:
    """Screenshot the report and assert that the frame of every plot holds drawn data.

    Where the plots are comes from a copy of the page with a probe script (and no
    CSP); the screenshot is of the report itself, at the same width. Returns the
    plots' geometry. Inside a frame there is only the light grid and the data, so
    an empty plot has almost no ink and no pixel in a series colour.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    page = workdir / "report.html"
    page.write_text(html, encoding="utf-8")
    probe = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    probe = probe.replace("</body>", _GEOMETRY + "</body>")
    (workdir / "probe.html").write_text(probe, encoding="utf-8")
    dom, _ = browser.run(
        (workdir / "probe.html").as_uri(), "--dump-dom", f"--window-size={WIDTH},2000"
    )
    found = re.search(r'<pre id="geometry">(.*?)</pre>', dom, re.S)
    assert found is not None, "the geometry probe did not run"
    geometry = json.loads(found.group(1))
    height = int(geometry["height"])
    _, err = browser.run(page.as_uri(), f"--screenshot={shot}", f"--window-size={WIDTH},{height}")
    assert shot.exists(), err[-2000:]
    image = decode_png(shot.read_bytes())
    assert image.shape[0] == height and image.shape[1] == WIDTH
    rgb = image[:, :, :3].astype(np.int16)
    colors = _palette_rgb()
    plots: list[dict[str, Any]] = geometry["plots"]
    for plot in plots:
        x0, y0 = int(plot["x"]) + 2, int(plot["y"]) + 2
        x1, y1 = int(plot["x"] + plot["w"]) - 2, int(plot["y"] + plot["h"]) - 2
        area = rgb[y0:y1, x0:x1].reshape(-1, 3)
        assert len(area) > 10_000, plot
        ink = np.any(area < 235, axis=1).mean()
        assert ink > 0.002, f"{plot['id']}: only {ink:.2%} of the plot area is drawn"
        close = np.abs(area[:, None, :] - colors[None, :, :]).max(axis=2) <= 24
        assert close.any(axis=1).sum() > 50, f"{plot['id']}: no data drawn"
    return plots
