"""Reports and decisions: from a sweep's results to the configuration to deploy.

Everything is built from :class:`servesweep.store.records.SweepData`, so a report
renders from any store, finished or still running.

- :func:`render` - ``table`` | ``markdown`` | ``csv`` | ``json`` | ``html``
- :func:`find_best` / :func:`format_best` / :func:`best_to_json` - the best
  configuration under an objective and constraints, with every exclusion explained
- :func:`compare` / :func:`format_comparison` - two sweeps or two configurations,
  with each change judged against the run-to-run noise of repeats
"""

from __future__ import annotations

from servesweep.errors import ConfigError
from servesweep.report.best import (
    BestResult,
    Candidate,
    Exclusion,
    best_to_json,
    find_best,
    format_best,
)
from servesweep.report.compare import Comparison, MetricChange, compare, format_comparison
from servesweep.report.export import JSON_FORMAT, JSON_VERSION, render_csv, render_json
from servesweep.report.html import render_html
from servesweep.report.tables import render_markdown, render_table
from servesweep.store.records import SweepData

__all__ = [
    "FORMATS",
    "JSON_FORMAT",
    "JSON_VERSION",
    "BestResult",
    "Candidate",
    "Comparison",
    "Exclusion",
    "MetricChange",
    "best_to_json",
    "compare",
    "find_best",
    "format_best",
    "format_comparison",
    "render",
]

FORMATS: tuple[str, ...] = ("table", "markdown", "csv", "json", "html")


def render(data: SweepData, fmt: str, *, color: bool = False, width: int = 160) -> str:
    """The report of one sweep in ``fmt`` (see :data:`FORMATS`).

    ``color`` only affects ``table`` (the caller decides it: a terminal and no
    ``NO_COLOR``); ``width`` is the table's maximum width in characters.
    """
    if fmt == "table":
        return render_table(data, color=color, width=width)
    if fmt == "markdown":
        return render_markdown(data)
    if fmt == "csv":
        return render_csv(data)
    if fmt == "json":
        return render_json(data)
    if fmt == "html":
        return render_html(data)
    raise ConfigError(
        f"unknown report format {fmt!r} (use one of: {', '.join(FORMATS)})", key="format"
    )
