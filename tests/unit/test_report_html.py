"""The HTML report: self-contained, every hostile text escaped, all sections there."""

from __future__ import annotations

from html.parser import HTMLParser

from helpers.report_data import XSS, hostile_sweep, sweep_data, throughput_sweep
from servesweep.report import render

ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "script", "h1", "h2", "p", "b", "i",
    "span", "div", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "pre", "code",
    "details", "summary", "svg", "text", "rect", "line", "path", "circle", "g",
}  # fmt: skip


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.script_text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_text.append(data)


def _parse(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    parser.close()
    return parser


def test_hostile_text_is_escaped_everywhere() -> None:
    html = render(hostile_sweep(), "html")
    assert XSS not in html
    assert "<script>alert(1)" not in html
    parsed = _parse(html)
    tags = [t for t, _ in parsed.tags]
    assert set(tags) <= ALLOWED_TAGS, set(tags) - ALLOWED_TAGS
    assert tags.count("script") == 1
    assert "pwned" not in "".join(parsed.script_text)
    for tag, attrs in parsed.tags:
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name)
            assert name != "src", tag
            assert "javascript:" not in (value or "")
    # the hostile text is shown, as text
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in html
    for where in ("Traceback &lt;script", "line &lt;script", "serve --x &#x27;&lt;script"):
        assert where in html


def test_self_contained_no_external_requests() -> None:
    html = render(throughput_sweep(), "html")
    parsed = _parse(html)
    for tag, attrs in parsed.tags:
        for name, value in attrs:
            if name in ("href", "src", "xlink:href", "action"):
                raise AssertionError(f"{tag} {name}={value}: a report loads nothing")
    lowered = html.lower()
    assert "@import" not in lowered and "url(" not in lowered
    assert lowered.count("http://") == lowered.count('xmlns="http://www.w3.org/2000/svg"')
    assert "https://" not in lowered
    csp = next(
        dict(a)["content"]
        for t, a in parsed.tags
        if t == "meta" and ("http-equiv", "Content-Security-Policy") in a
    )
    assert csp is not None and "default-src 'none'" in csp and "script-src 'sha256-" in csp


def test_sections_and_plots_present() -> None:
    html = render(throughput_sweep(), "html")
    for anchor in ('id="summary"', 'id="best"', 'id="plots"', 'id="timeline"', 'id="memory"',
                   'id="results"', 'id="evals"', 'id="failures"'):  # fmt: skip
        assert anchor in html
    ids = {dict(a).get("id") for t, a in _parse(html).tags if t == "svg"}
    assert {"plot-objective-0", "plot-objective-1", "plot-pareto-0", "plot-timeline",
            "plot-memory"} <= ids  # fmt: skip
    assert "<code>vllm serve m --budget 8 --topk 4</code>" in html
    assert "torch.OutOfMemoryError: CUDA out of memory on GPU 1" in html
    # GPU-hours: bench 3 trials x 30 s x 2 GPUs = 0.05 h
    assert '<td class="n" data-v="0.05">0.050</td>' in html


def test_report_of_a_sweep_with_nothing_measured() -> None:
    html = render(sweep_data([], {}), "html")
    assert "not decided" in html and "<svg" not in html
