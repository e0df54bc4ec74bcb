"""The results as a table: terminal (rich, plain unless ``color``) and Markdown.

One row per trial x workload x level (repeats aggregated: ``mean ±stdev``), the
outcome and failure class of each trial, then every failure with its one-line
evidence, pass rates and flipped eval tasks, and the best configuration.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servesweep.errors import ServesweepError
from servesweep.models import Outcome
from servesweep.report.best import find_best
from servesweep.report.data import (
    KEY_METRICS,
    format_number,
    format_stats,
    format_value,
    metric_names,
    outcome_counts,
    printable,
    swept_params,
)
from servesweep.report.evals import eval_rates, task_flips
from servesweep.report.refs import ResultIndex, objective_of
from servesweep.spec.constraints import parse_constraint
from servesweep.store.records import SweepData, TrialRecord

__all__ = ["TableView", "render_markdown", "render_table", "table_view"]

MAX_METRIC_COLUMNS = 7


@dataclass(frozen=True)
class TableView:
    """The table as plain strings, plus the lines shown below it."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    row_outcomes: tuple[str, ...]
    failures: tuple[str, ...]
    evals: tuple[str, ...]
    footer: tuple[str, ...]


def _outcome_cell(trial: TrialRecord) -> str:
    if trial.outcome is Outcome.FAILED:
        cls = trial.failure_class.value if trial.failure_class else "unclassified"
        reason = trial.evidence.reason if trial.evidence and trial.evidence.reason else None
        return f"failed {cls}" + (f" ({reason})" if reason else "")
    if trial.outcome is Outcome.RUNNING and trial.phase is not None:
        return f"running ({trial.phase.value})"
    return str(trial.outcome.value)


def _one_line(text: str) -> str:
    return printable(" ".join(text.split()))


def table_view(data: SweepData, max_metrics: int = MAX_METRIC_COLUMNS) -> TableView:
    index = ResultIndex(data)
    params = swept_params(data)
    all_levels = [lvl for levels in index.levels.values() for lvl in levels]
    names = metric_names(all_levels)
    preferred = [*_decision_metrics(data), "pass_rate", *KEY_METRICS]
    shown = [m for m in dict.fromkeys(preferred) if m in names][:max_metrics]
    if not shown:
        shown = names[:max_metrics]
    repeats = any(len(lvl.repeats) > 1 for lvl in all_levels)
    headers = ["trial", *params, "outcome", "workload", "level"]
    headers += ["n"] if repeats else []
    headers += shown
    rows: list[tuple[str, ...]] = []
    outcomes: list[str] = []
    trials = sorted(data.trials, key=lambda t: (t.seq, t.id))
    for trial in trials:
        head = [f"#{trial.id}", *(format_value(trial.params.get(p)) for p in params)]
        levels = index.levels.get(trial.id, [])
        if not levels:
            levels_cells: list[list[str]] = [["-", "-", *(["-"] if repeats else [])]]
            metric_cells: list[list[str]] = [["-"] * len(shown)]
        else:
            levels_cells = [
                [lvl.workload, lvl.level, *([str(len(lvl.repeats))] if repeats else [])]
                for lvl in levels
            ]
            metric_cells = [[format_stats(lvl.metrics.get(m)) for m in shown] for lvl in levels]
        for lcells, mcells in zip(levels_cells, metric_cells, strict=True):
            rows.append(
                tuple(_one_line(c) for c in [*head, _outcome_cell(trial), *lcells, *mcells])
            )
            outcomes.append(trial.outcome.value)
    failures = tuple(
        _one_line(
            f"#{t.id} {t.failure_class.value if t.failure_class else 'failed'}: "
            + (t.evidence.summary() if t.evidence else "no evidence recorded")
        )
        for t in trials
        if t.outcome is Outcome.FAILED
    )
    evals = tuple(
        f"#{r.trial_id} {r.workload}: {r.passed}/{r.total} passed ({r.pass_rate:.0%})"
        for r in eval_rates(data)
    )
    evals += tuple(
        f"flipped {f.workload}/{f.task_id}: "
        + ", ".join(f"#{tid} {status}" for tid, status in f.statuses)
        for f in task_flips(data)
    )
    counts = outcome_counts(data)
    title = _one_line(
        f"sweep {data.sweep.name} (#{data.sweep.id}): {len(data.trials)} "
        + ("trial, " if len(data.trials) == 1 else "trials, ")
        + ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    )
    return TableView(
        title=title,
        headers=tuple(headers),
        rows=tuple(rows),
        row_outcomes=tuple(outcomes),
        failures=failures,
        evals=evals,
        footer=tuple(_best_lines(data)),
    )


def _decision_metrics(data: SweepData) -> list[str]:
    """Metric names of the objective and the constraints: shown first."""
    names: list[str] = []
    try:
        found = objective_of(data)
        if found is not None:
            names.append(found[0].metric)
        names.extend(parse_constraint(text).ref.metric for text in data.constraints)
    except ServesweepError:
        pass
    return names


def _best_lines(data: SweepData) -> list[str]:
    try:
        best = find_best(data)
    except ServesweepError as exc:
        return [_one_line(f"best: not decided ({exc})")]
    objective = ", ".join(f"{d} {k}" for k, d in best.objectives)
    if best.winner is None:
        return [f"best: no feasible configuration for {objective} (servesweep best explains)"]
    value = format_number(best.winner.values[0])
    lines = [_one_line(f"best ({objective}): {best.winner.label} = {value}")]
    lines += [_one_line(f"note: {n}") for n in best.notes]
    return lines


_STYLES = {"ok": "green", "failed": "red", "skipped": "yellow", "interrupted": "magenta"}


def _rich_table(view: TableView, color: bool) -> Table:
    table = Table(title=Text(view.title), title_justify="left", show_lines=False)
    for header in view.headers:
        numeric = header not in ("trial", "outcome", "workload", "level")
        table.add_column(Text(header), justify="right" if numeric else "left", no_wrap=not numeric)
    for row, outcome in zip(view.rows, view.row_outcomes, strict=True):
        style = _STYLES.get(outcome, "") if color else ""
        table.add_row(*(Text(cell) for cell in row), style=style)
    return table


def render_table(data: SweepData, *, color: bool = False, width: int = 160) -> str:
    """The terminal table; plain text unless ``color`` (the caller checks NO_COLOR
    and whether the output is a terminal). Metric columns are dropped from the
    right until the table fits ``width`` (at least three stay)."""
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        highlight=False,
        emoji=False,
        markup=False,
        legacy_windows=False,
    )
    wide = Console(file=io.StringIO(), width=10_000, color_system=None)
    for max_metrics in range(MAX_METRIC_COLUMNS, 2, -1):
        view = table_view(data, max_metrics)
        table = _rich_table(view, color)
        if wide.measure(table).maximum <= width:
            break
    console.print(table)
    for heading, lines in (("failures:", view.failures), ("evals:", view.evals)):
        if lines:
            console.print(Text(heading, style="bold" if color else ""))
            for line in lines:
                console.print(Text("  " + line), soft_wrap=True)
    for line in view.footer:
        console.print(Text(line, style="bold" if color else ""), soft_wrap=True)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _md_cell(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("|", "\\|")
    for char in "`*_<>[]":
        escaped = escaped.replace(char, "\\" + char)
    return escaped


def render_markdown(data: SweepData) -> str:
    """The same table as GitHub Markdown; every cell escaped."""
    view = table_view(data)
    out = [f"## {_md_cell(view.title)}", ""]
    out.append("| " + " | ".join(_md_cell(h) for h in view.headers) + " |")
    out.append("|" + "|".join("---" for _ in view.headers) + "|")
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in view.rows]
    for heading, lines in (("Failures", view.failures), ("Evals", view.evals)):
        if lines:
            out += ["", f"### {heading}", ""]
            out += [f"- {_md_cell(line)}" for line in lines]
    if view.footer:
        out.append("")
        out += [f"**{_md_cell(view.footer[0])}**", *(f"- {_md_cell(x)}" for x in view.footer[1:])]
    return "\n".join(out) + "\n"
