"""Reports: a sweep's results and the decisions made on them, rendered.

Everything is built from :class:`servesweep.records.SweepData`, so a report
renders from any store, finished or still running.

- :func:`render` - ``table`` | ``markdown`` | ``csv`` | ``json`` | ``html``
- :func:`format_best` / :func:`best_to_json` - the best configuration under an
  objective and constraints, with every exclusion explained, as decided by
  :func:`servesweep.decide.best.find_best` (this package renders decisions, it
  makes none)
- :func:`compare` / :func:`format_comparison` - two sweeps or two configurations,
  with each change judged against the run-to-run noise of repeats
- :func:`format_number` - how every report writes a number (significant digits);
  live progress lines use it too
"""

from __future__ import annotations

from collections.abc import Sequence

from servesweep.decide.numbers import format_number
from servesweep.errors import ConfigError
from servesweep.records import SweepData
from servesweep.report.best_view import best_to_json, format_best
from servesweep.report.compare import Comparison, MetricChange, compare, format_comparison
from servesweep.report.export import JSON_FORMAT, JSON_VERSION, render_csv, render_json
from servesweep.report.html import render_html
from servesweep.report.tables import render_markdown, render_table

__all__ = [
    "FORMATS",
    "JSON_FORMAT",
    "JSON_VERSION",
    "Comparison",
    "MetricChange",
    "best_to_json",
    "compare",
    "format_best",
    "format_comparison",
    "format_number",
    "render",
]

FORMATS: tuple[str, ...] = ("table", "markdown", "csv", "json", "html")


def render(
    data: SweepData,
    fmt: str,
    *,
    color: bool = False,
    width: int = 160,
    columns: Sequence[str] | None = None,
    reload_s: float | None = None,
) -> str:
    """The report of one sweep in ``fmt`` (see :data:`FORMATS`).

    ``color`` only affects ``table`` (the caller decides it: a terminal and no
    ``NO_COLOR``); ``width`` is the table's maximum width in characters; ``columns``
    chooses the columns of ``table`` and ``markdown`` (params and metric names);
    ``reload_s`` makes an ``html`` report of a running sweep reload itself.
    """
    fmt = {"md": "markdown"}.get(fmt, fmt)
    if fmt == "table":
        return render_table(data, color=color, width=width, columns=columns)
    if fmt == "markdown":
        return render_markdown(data, columns)
    if fmt == "csv":
        return render_csv(data)
    if fmt == "json":
        return render_json(data)
    if fmt == "html":
        return render_html(data, reload_s=reload_s)
    raise ConfigError(
        f"unknown report format {fmt!r} (use one of: {', '.join(FORMATS)})", key="format"
    )
