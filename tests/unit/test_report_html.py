"""The HTML report: one self-contained file, every hostile text escaped by the
template engine, all sections there, the pinned chart library and the CSP."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from html.parser import HTMLParser
from importlib import resources

from helpers.report_data import XSS, hostile_sweep, level, sweep_data, throughput_sweep, trial
from servesweep.report import render
from servesweep.report.html import ECHARTS_VERSION
from servesweep.report.timeline import PHASE_COLORS

ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "script", "h1", "h2", "p", "b", "i",
    "span", "div", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "pre", "code",
    "details", "summary", "nav", "a", "figure", "figcaption", "section",
}  # fmt: skip
ECHARTS_SHA256 = "b66b25aeb4df84e33199dc21694014d336d222cbd9deb0e5a7c14bd6aa0d0fd0"
"""dist/echarts.min.js of the npm package echarts 6.1.0 (dev/update-echarts.sh)."""


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.scripts: list[str] = []
        self._script: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        if tag == "script":
            self._script = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append("".join(self._script))
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script.append(data)


def _parse(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    parser.close()
    return parser


def _payload(html: str) -> dict:  # type: ignore[type-arg]
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html)
    assert found is not None
    data: dict = json.loads(found.group(1))  # type: ignore[type-arg]
    return data


def test_hostile_text_is_escaped_everywhere() -> None:
    html = render(hostile_sweep(), "html")
    assert XSS not in html
    assert "<script>alert(1)" not in html
    parsed = _parse(html)
    tags = [t for t, _ in parsed.tags]
    assert set(tags) <= ALLOWED_TAGS, set(tags) - ALLOWED_TAGS
    # the JSON data, the chart library and the page's script; nothing else runs
    assert tags.count("script") == 3
    assert [dict(a).get("type") for t, a in parsed.tags if t == "script"] == [
        "application/json", None, None,
    ]  # fmt: skip
    for tag, attrs in parsed.tags:
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name)
            assert name not in ("src", "style"), tag
            assert "javascript:" not in (value or "")
            if name == "href":
                assert (value or "").startswith("#"), value  # in-page links only
    # the hostile text is shown, as text; in the JSON data it cannot close the element
    assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;" in html
    for where in ("Traceback &lt;script", "line &lt;script", "serve --x &#39;&lt;script"):
        assert where in html
    data = _payload(html)
    assert any(v == XSS for t in data["trials"].values() for _, v in t["params"])


def test_self_contained_pinned_library_and_csp() -> None:
    html = render(throughput_sweep(), "html")
    parsed = _parse(html)
    library, script = parsed.scripts[1], parsed.scripts[2]
    shipped = (resources.files("servesweep.report") / "assets" / "echarts.min.js").read_text()
    assert library == shipped
    assert hashlib.sha256(shipped.encode()).hexdigest() == ECHARTS_SHA256
    assert f'version="{ECHARTS_VERSION}"' in shipped
    page = html.replace(library, "").replace(script, "").lower()
    assert "@import" not in page and "url(" not in page
    assert "http://" not in page and "https://" not in page
    csp = next(
        dict(a)["content"]
        for t, a in parsed.tags
        if t == "meta" and ("http-equiv", "Content-Security-Policy") in a
    )
    assert csp is not None and "default-src 'none'" in csp
    assert "unsafe-eval" not in csp and "unsafe-inline" not in csp
    for text in (library, script):
        digest = hashlib.sha256(text.encode()).digest()
        import base64

        assert f"'sha256-{base64.b64encode(digest).decode()}'" in csp


def test_sections_and_charts_present() -> None:
    html = render(throughput_sweep(), "html")
    for anchor in ('id="summary"', 'id="best"', 'id="progress"', 'id="effects"',
                   'id="tradeoffs"', 'id="timeline"', 'id="memory"', 'id="results"',
                   'id="evals"', 'id="failures"'):  # fmt: skip
        assert anchor in html
    charts = {c["id"] for c in _payload(html)["charts"]}
    assert {"chart-heatmap", "chart-effect-0", "chart-effect-1", "chart-parallel",
            "chart-tradeoff-0", "chart-per-gpu-0", "chart-timeline", "chart-memory",
            "chart-progress-trials", "chart-progress-gpu-hours"} == charts  # fmt: skip
    for chart in charts:
        assert f'<div class="plot" id="{chart}"' in html
    assert "<code>vllm serve m --budget 8 --topk 4</code>" in html
    assert "torch.OutOfMemoryError: CUDA out of memory on GPU 1" in html
    # GPU time: bench 3 trials x 30 s x 2 GPUs = 0.05 h, written in minutes
    assert '<td class="n" data-v="0.05">3 GPU-min</td>' in html
    assert "e-0" not in html.split('id="best"')[0]  # no exponent in the summary
    css = (resources.files("servesweep.report") / "assets" / "report.css").read_text()
    for phase, color in PHASE_COLORS.items():  # the summary's swatches match the timeline
        assert f".ph-{phase} {{ background: {color}; }}" in css


def test_ranking_says_tied_or_behind_the_winner() -> None:
    data = sweep_data(
        [trial(1, {"b": 1}), trial(2, {"b": 2})],
        {
            1: [level("chat", "c1", r, output_throughput=v) for r, v in enumerate((10.0, 14.0))],
            2: [level("chat", "c1", r, output_throughput=v) for r, v in enumerate((11.0, 12.0))],
        },
        objective={"maximize": "chat.c1.output_throughput"},
    )
    html = render(data, "html")
    ranking = html[html.index('id="ranking"') : html.index("</table>", html.index('id="ranking"'))]
    assert "<th>against the winner</th>" in ranking
    assert ">winner (picked from the tie)</td>" in ranking
    # 12 vs 11.5: a 4.3 % lead, but trial 1's repeats were 10 and 14
    assert ">tied: #1 leads by 4.3%" in ranking and "within its uncertainty</td>" in ranking
    assert 'title="95% interval' in ranking


def test_engine_version_in_the_header() -> None:
    data = throughput_sweep()
    env = {**data.sweep.environment, "engine": "vllm", "engine_version": "0.11.2"}
    from dataclasses import replace

    html = render(replace(data, sweep=replace(data.sweep, environment=env)), "html")
    assert "; engine vllm 0.11.2</p>" in html
    assert "environment (engine version 0.11.2)" in html


def test_report_of_a_sweep_with_nothing_measured() -> None:
    html = render(sweep_data([], {}), "html")
    assert "not decided" in html and _payload(html)["charts"] == []


def test_live_reload_only_while_the_sweep_runs() -> None:
    from dataclasses import replace

    from servesweep.report.html import render_html

    data = throughput_sweep()
    assert _payload(render_html(data, reload_s=5))["reload_s"] == 5
    assert 'id="live"' in render_html(data, reload_s=5)
    done = replace(data, sweep=replace(data.sweep, finished_at=data.sweep.created_at + 500))
    assert _payload(render_html(done, reload_s=5))["reload_s"] is None
    assert 'id="live"' not in render_html(done, reload_s=5)
    assert _payload(render_html(data))["reload_s"] is None


def test_a_grid_leads_with_its_effects_and_a_search_with_its_progress() -> None:
    grid = render(throughput_sweep(), "html")
    assert grid.index('id="effects"') < grid.index('id="progress"')
    assert ">Progress</h2>" in grid and "Search progress" not in grid
    # throughput_sweep's trials, as a TPE search over the same params proposed them
    spec_text = (
        "name: demo\nserver: {engine: sim}\nworkloads:\n  - {name: chat, concurrency: [1, 8]}\n"
        "params:\n  grid:\n    budget: [4, 8, 12, 16]\n    topk: [2, 4, 6, 8]\n"
        "search: {strategy: tpe, trials: 4}\n"
    )
    base = throughput_sweep()
    searched = render(replace(base, sweep=replace(base.sweep, spec_text=spec_text)), "html")
    assert searched.index('id="progress"') < searched.index('id="effects"')
    assert ">Search progress</h2>" in searched


def test_trials_that_failed_the_same_way_are_one_entry() -> None:
    from servesweep.models import Evidence

    def oom(n: int) -> Evidence:
        return Evidence(
            f"the server log has a fatal line after {n}.{n}s; the instance exited (exit code 1)",
            reason="oom",
            matched_line=f"torch.OutOfMemoryError: CUDA out of memory. Process {7700 + n}",
            log_path=f"runs/trial-{n}/server.log",
        )

    trials = [trial(n, {"b": n}, "failed", failure="start_crash", evidence=oom(n))
              for n in range(1, 8)]  # fmt: skip
    other = Evidence("port 8000 is in use by pid 9", reason="port_in_use")
    trials.append(trial(8, {"b": 8}, "failed", failure="port_in_use", evidence=other))
    html = render(sweep_data(trials, {}), "html")
    failures = html[html.index('id="failures"') :]
    assert failures.count("<details open>") == 2
    assert "7 trials (#1, #2, #3, #4, #5, #6, #7)</b> failed the same way" in failures
    for n in range(1, 8):
        assert f"runs/trial-{n}/server.log" in failures  # every trial's log is listed
    assert "<b>#8</b> b=8" in failures
