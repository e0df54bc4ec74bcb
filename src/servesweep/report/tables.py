"""The results as a table: terminal (rich, plain unless ``color``) and Markdown.

One row per trial x workload x level (repeats aggregated: ``mean ±half-interval``), the
outcome and failure class of each trial, then every failure with its one-line
evidence, pass rates and flipped eval tasks, and the best configuration.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from servesweep.decide.acceptance import UNTRUSTED_MARK
from servesweep.decide.best import find_best
from servesweep.decide.refs import ResultIndex, objective_of
from servesweep.decide.resources import trial_gpus
from servesweep.decide.stats import (
    KEY_METRICS,
    LevelStats,
    format_number,
    format_stats,
    format_value,
    in_plan_count,
    metric_names,
    out_of_plan,
    outcome_counts,
    printable,
    swept_params,
)
from servesweep.errors import ConfigError, ServesweepError
from servesweep.metrics_catalog import COST_PER_MTOK, GPUS
from servesweep.models import Outcome
from servesweep.records import SweepData, TrialRecord
from servesweep.report.best_view import untrusted_suffix
from servesweep.report.evals import eval_rates, task_flips
from servesweep.report.predicted_view import predicted_lines
from servesweep.spec.constraints import parse_constraint

__all__ = [
    "TableView",
    "acceptance_lines",
    "column_priority",
    "hidden_line",
    "render_markdown",
    "render_table",
    "table_view",
]

FIXED = ("trial", "outcome", "workload", "level")
"""Columns every table keeps: without them no number can be read."""
UNRELIABLE_MARK = "*"
"""After a level the load generator could not time (listed under the table)."""
HIDDEN_LISTED = 8
"""Names of hidden columns listed under the table (the rest are counted)."""


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
    hidden: tuple[str, ...] = ()
    """Default columns left out to fit the width, most wanted first."""
    more: tuple[str, ...] = ()
    """Metrics measured but not among the default columns (nor chosen)."""
    unreliable: tuple[str, ...] = ()
    """Levels the load generator could not time (marked ``*`` in the level column)."""
    legend: tuple[str, ...] = ()
    """What the cells' ``±`` means (under the table)."""
    acceptance: tuple[str, ...] = ()
    """Which dataset and mode each workload's acceptance length was measured in, and
    why it is not trusted where it is not (marked ``?`` in its cells)."""
    """Columns left out (to fit the width, or not chosen with ``columns``)."""


def _outcome_cell(trial: TrialRecord) -> str:
    gone = "" if trial.in_plan else ", not in plan"
    if trial.outcome is Outcome.FAILED:
        cls = trial.failure_class.value if trial.failure_class else "unclassified"
        reason = trial.evidence.reason if trial.evidence and trial.evidence.reason else None
        return f"failed {cls}" + (f" ({reason})" if reason and reason != cls else "") + gone
    if trial.outcome is Outcome.RUNNING and trial.phase is not None:
        return f"running ({trial.phase.value})" + gone
    return str(trial.outcome.value) + gone


def _one_line(text: str) -> str:
    return printable(" ".join(text.split()))


def column_priority(data: SweepData, index: ResultIndex) -> tuple[list[str], list[str]]:
    """(the default columns, most wanted first; every other metric measured). Default:
    trial, outcome, the workload and level, the objective's metric, the swept params,
    the constraints' metrics, the repeat count, the acceptance length of speculative
    decoding (when measured), then the key metrics."""
    levels = [lvl for lv in index.levels.values() for lvl in lv]
    measured = metric_names(levels)
    named = _decision_metrics(data)
    decision = [m for m in named if m in measured or m == GPUS.name]
    repeats = ["n"] if any(len(lvl.repeats) > 1 for lvl in levels) else []
    order = [*FIXED, *decision[:1], *repeats, *swept_params(data), *decision[1:]]
    order += [GPUS.name] if COST_PER_MTOK.name in measured else []
    order += [m for m in ("acceptance_length", "pass_rate", *KEY_METRICS) if m in measured]
    order += [m for m in (COST_PER_MTOK.name,) if m in measured]
    default = list(dict.fromkeys(order))
    return default, sorted(set(measured) - set(default))


def _cells(
    data: SweepData, index: ResultIndex, headers: list[str]
) -> tuple[list[tuple[str, ...]], list[str]]:
    params = set(swept_params(data))
    rows: list[tuple[str, ...]] = []
    outcomes: list[str] = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        levels: list[LevelStats | None] = list(index.levels.get(trial.id, [])) or [None]
        for lvl in levels:
            row = []
            for h in headers:
                if h == "trial":
                    row.append(f"#{trial.number}")
                elif h == "outcome":
                    row.append(_outcome_cell(trial))
                elif h in params:
                    row.append(format_value(trial.params.get(h)))
                elif h == GPUS.name:
                    gpus = trial_gpus(data, trial)
                    row.append("-" if gpus is None else str(gpus))
                elif lvl is None:
                    row.append("-")
                elif h == "workload":
                    row.append(lvl.workload)
                elif h == "level":
                    row.append(lvl.level + (UNRELIABLE_MARK if lvl.unreliable else ""))
                elif h == "n":
                    row.append(str(len(lvl.repeats)))
                elif h == "acceptance_length":
                    ctx = lvl.acceptance
                    mark = UNTRUSTED_MARK if ctx is not None and not ctx.trusted else ""
                    row.append(format_stats(lvl.metrics.get(h)) + mark)
                else:
                    row.append(format_stats(lvl.metrics.get(h)))
            rows.append(tuple(_one_line(c) for c in row))
            outcomes.append(trial.outcome.value)
    return rows, outcomes


def _table_width(
    headers: Sequence[str], rows: Sequence[Sequence[str]], columns: Sequence[int]
) -> int:
    """Characters the rich table takes with these columns (one space of padding each
    side, one border character between and around them)."""
    return 1 + sum(max([len(headers[i]), *(len(r[i]) for r in rows)]) + 3 for i in columns)


def table_view(
    data: SweepData, width: int | None = None, columns: Sequence[str] | None = None
) -> TableView:
    """The table's content. ``columns`` (params and metric names, besides trial,
    outcome, workload and level) chooses the columns; otherwise the default columns of
    :func:`column_priority` are added in their order while the table fits ``width``
    characters (all of them when ``width`` is None). ``hidden`` says what was left out,
    the columns that did not fit first."""
    index = ResultIndex(data)
    default, extra = column_priority(data, index)
    priority = default + extra
    if columns is not None:
        unknown = [c for c in columns if c not in priority]
        if unknown:
            raise ConfigError(
                f"no column {', '.join(map(repr, unknown))} in this sweep "
                f"(columns: {', '.join(priority)})",
                key="--columns",
            )
        wanted = [*FIXED, *columns]
    else:
        wanted = default
    # natural order: trial, params, outcome, workload, level, n, metrics by priority
    params = swept_params(data)
    natural = ["trial", *params, "outcome", "workload", "level", "n"]
    ordered = [c for c in natural if c in wanted] + [c for c in wanted if c not in natural]
    rows, outcomes = _cells(data, index, ordered)
    keep = list(range(len(ordered)))
    constant: list[str] = []
    dropped: list[str] = []
    if columns is None and width is not None:
        fixed = list(FIXED)
        if _table_width(ordered, rows, keep) > width:
            # short of room: a column with one value in every row (one workload) is
            # said once, above the table, and its room goes to a metric
            for name in ("workload", "level"):
                values = {r[ordered.index(name)] for r in rows} - {"-"}
                if len(values) == 1:
                    fixed.remove(name)
                    constant.append(f"{name} {values.pop()}")
                    dropped.append(name)
        keep = [ordered.index(c) for c in fixed]
        for name in default[len(FIXED) :]:
            trial_keep = sorted([*keep, ordered.index(name)])
            if _table_width(ordered, rows, trial_keep) > width:
                break  # strictly by priority: what follows is hidden too
            keep = trial_keep
    keep.sort()
    headers = [ordered[i] for i in keep]
    hidden = tuple(c for c in default if c not in headers and c not in ("n", *dropped))
    more = tuple(c for c in extra if c not in headers)
    rows = [tuple(r[i] for i in keep) for r in rows]
    trials = sorted(data.trials, key=lambda t: (t.seq, t.id))
    failures = tuple(
        _one_line(
            f"#{t.number} {t.failure_class.value if t.failure_class else 'failed'}: "
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
    unreliable = tuple(
        _one_line(f"#{lvl.trial_id} {lvl.workload} {lvl.level}: {lvl.unreliable}")
        for t in trials
        for lvl in index.levels.get(t.id, ())
        if lvl.unreliable
    )
    if unreliable:
        left = "counted" if data.include_unreliable else "left out of best and constraints"
        unreliable += (
            f"({left}; raise workloads[].workers or use a less busy machine, or set "
            "include_unreliable: true to count them)",
        )
    counts = outcome_counts(data)
    planned, removed = in_plan_count(data), out_of_plan(data)
    title = _one_line(
        f"sweep {data.sweep.name} (#{data.sweep.id}): {planned} "
        + ("trial" if planned == 1 else "trials")
        + "".join(f", {n} {o}" for o, n in counts.items() if n)
        + (f"; {removed} more no longer in the sweep file (marked not in plan)" if removed else "")
        + (f"; every row: {', '.join(constant)}" if constant else "")
    )
    return TableView(
        title=title,
        headers=tuple(headers),
        rows=tuple(rows),
        row_outcomes=tuple(outcomes),
        failures=failures,
        evals=evals,
        footer=tuple(_best_lines(data)),
        legend=tuple(_interval_line(index)),
        acceptance=tuple(acceptance_lines(index)),
        hidden=hidden,
        more=more,
        unreliable=unreliable,
    )


def hidden_line(view: TableView, width: int | None) -> str | None:
    """What was left out and how to see it, or None."""
    if not view.hidden and not view.more:
        return None
    parts = []
    if view.hidden:
        n = len(view.hidden)
        names = ", ".join(view.hidden[:HIDDEN_LISTED])
        rest = n - HIDDEN_LISTED
        fit = f" to fit {width} characters" if width is not None else ""
        parts.append(
            f"{n} column{'s' if n > 1 else ''} hidden{fit}: {names}"
            + (f" and {rest} more" if rest > 0 else "")
            + "."
        )
    if view.more:
        m = len(view.more)
        parts.append(f"{m} more metric{'s' if m > 1 else ''} measured (not default columns).")
    example = (view.hidden or view.more)[0]
    wider = ", a wider terminal (COLUMNS=250)" if view.hidden and width is not None else ""
    parts.append(
        f"See them with --columns NAME,... (e.g. --columns {example}){wider}, "
        "or --format csv / json / html"
    )
    return _one_line(" ".join(parts))


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


def _interval_line(index: ResultIndex) -> list[str]:
    """What ``±`` means, when a cell has one."""
    found = {
        s.confidence
        for levels in index.levels.values()
        for lvl in levels
        for s in lvl.metrics.values()
        if s.confidence is not None
    }
    if not found:
        return []
    conf = ", ".join(f"{c:.0%}" for c in sorted(found))
    return [f"±: half the {conf} confidence interval, from the level's requests and its repeats"]


def _best_lines(data: SweepData) -> list[str]:
    try:
        best = find_best(data)
    except ServesweepError as exc:
        return [_one_line(f"best: not decided ({exc})")]
    objective = ", ".join(f"{d} {k}" for k, d in best.objectives)
    if best.winner is None:
        return [f"best: no feasible configuration for {objective} (servesweep best explains)"]
    value = format_number(best.winner.values[0])
    lines = [
        _one_line(f"best ({objective}): {best.winner.label} = {value}{untrusted_suffix(best)}")
    ]
    lines += [_one_line(f"note: {n}") for n in best.notes]
    return lines


_STYLES = {"ok": "green", "failed": "red", "skipped": "yellow", "interrupted": "magenta"}


def _rich_table(view: TableView, color: bool) -> Table:
    table = Table(show_lines=False)
    for header in view.headers:
        numeric = header not in ("trial", "outcome", "workload", "level")
        table.add_column(Text(header), justify="right" if numeric else "left", no_wrap=not numeric)
    for row, outcome in zip(view.rows, view.row_outcomes, strict=True):
        style = _STYLES.get(outcome, "") if color else ""
        table.add_row(*(Text(cell) for cell in row), style=style)
    return table


def render_table(
    data: SweepData,
    *,
    color: bool = False,
    width: int = 160,
    columns: Sequence[str] | None = None,
) -> str:
    """The terminal table; plain text unless ``color`` (the caller checks NO_COLOR
    and whether the output is a terminal). Columns are chosen by priority to fit
    ``width`` (or are ``columns``); a line under the table says how many were hidden
    and how to see them."""
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
    view = table_view(data, width, columns)
    # the title on a line of its own: a narrow table would wrap it
    console.print(Text(view.title, style="italic" if color else ""), soft_wrap=True)
    console.print(_rich_table(view, color))
    for line in view.legend:
        console.print(Text(line, style="dim" if color else ""), soft_wrap=True)
    hidden = hidden_line(view, width) if columns is None else None
    if hidden:
        console.print(Text(hidden, style="dim" if color else ""), soft_wrap=True)
    sections = (
        ("failures:", view.failures),
        (
            f"unreliable ({UNRELIABLE_MARK}): the load generator could not keep time",
            view.unreliable,
        ),
        ("evals:", view.evals),
        ("acceptance_length measured from:", acceptance_sources(data)),
        (ACCEPTANCE_HEADING, view.acceptance),
        ("performance predicted against measured:", predicted_lines(data)),
    )
    for heading, lines in sections:
        if lines:
            console.print(Text(heading, style="bold" if color else ""))
            for line in lines:
                console.print(Text("  " + line), soft_wrap=True)
    for line in view.footer:
        console.print(Text(line, style="bold" if color else ""), soft_wrap=True)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


_SOURCES = {
    "engine_counters": "the engine's speculative-decoding counters on /metrics",
    "engine_gauge": "the engine's acceptance gauge on /metrics",
    "tokens_per_chunk_estimate": "an estimate from tokens per streamed chunk (no counters)",
}


def acceptance_sources(data: SweepData) -> list[str]:
    """One line per trial whose acceptance length was measured: where it came from."""
    lines = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        found = sorted(
            {
                str(r.info["acceptance_source"])
                for r in data.results.get(trial.id, ())
                if r.info.get("acceptance_source")
            }
        )
        if found:
            said = "; ".join(f"{s} ({_SOURCES.get(s, s)})" for s in found)
            lines.append(_one_line(f"#{trial.id}: {said}"))
    return lines


ACCEPTANCE_HEADING = "acceptance_length measured on:"


def acceptance_lines(index: ResultIndex) -> list[str]:
    """One line per workload with an acceptance length: the dataset and mode it was
    measured in and, when not trusted (random-token prompts, ``ignore_eos``), why."""
    seen: dict[tuple[str, str], str | None] = {}
    for trial_id in sorted(index.levels):
        for lvl in index.levels[trial_id]:
            ctx = lvl.acceptance
            if ctx is not None:
                seen.setdefault((lvl.workload, ctx.describe()), ctx.caveat)
    lines = []
    for (workload, said), caveat in seen.items():
        if caveat is None:
            lines.append(_one_line(f"{workload}: {said}"))
        else:
            lines.append(_one_line(f"{workload}: {said}; {UNTRUSTED_MARK} not trusted: {caveat}"))
    return lines


def _md_cell(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("|", "\\|")
    for char in "`*_<>[]":
        escaped = escaped.replace(char, "\\" + char)
    return escaped


def render_markdown(data: SweepData, columns: Sequence[str] | None = None) -> str:
    """The same table as GitHub Markdown (every default column, or ``columns``);
    every cell escaped."""
    view = table_view(data, None, columns)
    out = [f"## {_md_cell(view.title)}", ""]
    out.append("| " + " | ".join(_md_cell(h) for h in view.headers) + " |")
    out.append("|" + "|".join("---" for _ in view.headers) + "|")
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in view.rows]
    if view.legend:
        out += ["", *(_md_cell(line) for line in view.legend)]
    sections = (
        ("Failures", view.failures),
        ("Unreliable levels (*): the load generator could not keep time", view.unreliable),
        ("Evals", view.evals),
        (ACCEPTANCE_HEADING.rstrip(":"), view.acceptance),
    )
    for heading, lines in sections:
        if lines:
            out += ["", f"### {_md_cell(heading)}", ""]
            out += [f"- {_md_cell(line)}" for line in lines]
    if (view.hidden or view.more) and columns is None:
        out += ["", _md_cell(hidden_line(view, None) or "")]
    if view.footer:
        out.append("")
        out += [f"**{_md_cell(view.footer[0])}**", *(f"- {_md_cell(x)}" for x in view.footer[1:])]
    return "\n".join(out) + "\n"
