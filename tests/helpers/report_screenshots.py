"""The screenshots of docs/reports.md and the README, made as a user would: run the
quickstart and the failure-heavy sweep on the simulated engine, render their HTML
reports, open them in headless Chromium and photograph each view.

    .venv/bin/python tests/helpers/report_screenshots.py [OUT_DIR]   (default docs/img)

Prints the size of each report and where every picture went.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.report_browser import browser, open_report  # noqa: E402
from servesweep.sim.testing import free_port  # noqa: E402

SWEEPS = {
    "quickstart": ROOT / "examples" / "quickstart.yaml",
    "failures": ROOT / "docs" / "img" / "failure-heavy.yaml",
}
VIEWS = ("progress", "effects", "tradeoffs", "specdecode", "timeline", "memory")


def _run(sweep_file: Path) -> Path:
    """Run the sweep and write its HTML report; returns the report's path."""
    cmd = [sys.executable, "-m", "servesweep.cli.main"]
    done = subprocess.run(
        [*cmd, "run", str(sweep_file), "--quiet"], capture_output=True, text=True, timeout=900
    )
    if done.returncode not in (0, 1):  # 1: some trials failed, as intended
        raise SystemExit(f"{sweep_file.name}: {done.stderr[-2000:]}")
    out = sweep_file.with_suffix(".html")
    made = subprocess.run(
        [*cmd, "report", str(sweep_file), "--format", "html", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if made.returncode != 0:
        raise SystemExit(made.stderr)
    table = subprocess.run(
        [*cmd, "report", str(sweep_file)], capture_output=True, text=True, timeout=300,
        env={"COLUMNS": "150", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out.with_suffix(".txt").write_text(table.stdout, encoding="utf-8")
    return out


def main(argv: list[str]) -> int:
    dest = Path(argv[0]) if argv else ROOT / "docs" / "img"
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, browser() as chromium:
        for name, source in SWEEPS.items():
            sweep_file = Path(tmp) / source.name
            text = re.sub(r"port: \d+", f"port: {free_port()}", source.read_text())
            sweep_file.write_text(text, encoding="utf-8")
            report = _run(sweep_file)
            print(f"{name}: {report.stat().st_size / 2**20:.2f} MiB report")
            shutil.copy(report.with_suffix(".txt"), dest / f"report-{name}-table.txt")
            page = open_report(chromium, report)
            assert page.messages == [], page.messages
            top = page.page.locator("#best").bounding_box()
            assert top is not None
            page.page.screenshot(
                path=str(dest / f"report-{name}-top.png"),
                clip={"x": 0, "y": 0, "width": 1280, "height": min(top["y"] + 460, 1400)},
            )
            for view in VIEWS:
                section = page.page.locator(f"#view-{view}")
                if section.count():
                    section.screenshot(path=str(dest / f"report-{name}-{view}.png"))
            if page.page.locator("#view-failures").count():  # its first 900 pixels
                at = page.js("document.getElementById('view-failures').getBoundingClientRect()"
                             ".top + window.scrollY")  # fmt: skip
                page.page.screenshot(
                    path=str(dest / f"report-{name}-failures.png"), full_page=True,
                    clip={"x": 0, "y": at, "width": 1280, "height": 900},
                )  # fmt: skip
            # a hover: the heatmap cell of the best configuration explains itself
            page.page.locator("#chart-heatmap").scroll_into_view_if_needed()
            best = page.js(
                """() => {
                  const c = echarts.getInstanceByDom(document.getElementById('chart-heatmap'));
                  const s = c.getOption().series[0].data;
                  let top = 0;
                  s.forEach((d, i) => { if (d.value[2] > s[top].value[2]) top = i; });
                  return top;
                }"""
            )
            page.hover_point("chart-heatmap", 0, best)
            page.page.locator("#chart-heatmap").locator("xpath=..").screenshot(
                path=str(dest / f"report-{name}-hover.png")
            )
            if name == "quickstart":  # the README's picture
                shutil.copy(dest / "report-quickstart-top.png", dest / "report-html.png")
            print(f"{name}: screenshots in {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
