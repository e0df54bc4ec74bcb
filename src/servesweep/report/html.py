"""The HTML report: one self-contained file that works offline.

The page is built from Jinja2 templates (``report/templates``) with automatic
escaping: every text that came from a server, a model, a log or the sweep file is
escaped by the template engine, not by hand. Charts are drawn in the browser by
Apache ECharts (pinned, shipped as package data: :mod:`servesweep.report.assets`),
from JSON data embedded in the page; the page's own script builds each chart from
that data and explains a hovered point by the trial it stands for.

Nothing is loaded from anywhere: the Content-Security-Policy allows no request, and
runs only the two scripts of the page (ECharts and ours, each allowed by its
SHA-256 hash; no ``eval``); styles are allowed by their hash too.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

from servesweep.decide.acceptance import UNTRUSTED_MARK
from servesweep.decide.best import BestResult, Candidate, find_best
from servesweep.decide.mismatches import describe, trial_mismatches
from servesweep.decide.numbers import format_number, format_stats
from servesweep.decide.refs import ResultIndex, is_search
from servesweep.decide.resources import trial_gpus
from servesweep.decide.standing import objective_ref
from servesweep.decide.stats import (
    LevelStats,
    MetricStats,
    format_value,
    in_plan_count,
    metric_names,
    out_of_plan,
    outcome_counts,
    phase_costs,
    swept_params,
)
from servesweep.decide.uncertainty import margin
from servesweep.errors import ServesweepError
from servesweep.metrics_catalog import ACCEPTANCE_LENGTH, GPUS
from servesweep.models import Outcome
from servesweep.records import SweepData, TrialRecord
from servesweep.report.best_view import untrusted_suffix
from servesweep.report.charts import Chart, outcome_text, trial_catalog
from servesweep.report.effects import (
    acceptance_charts,
    heatmap_chart,
    metric_vs_param_charts,
    parallel_chart,
)
from servesweep.report.evals import eval_rates, task_flips
from servesweep.report.importance import MIN_TRIALS, importance_chart
from servesweep.report.predicted_view import predicted_table
from servesweep.report.progress import progress_charts
from servesweep.report.tables import acceptance_lines, column_priority
from servesweep.report.timeline import PHASE_COLORS, memory_chart, timeline_chart
from servesweep.report.tradeoffs import per_user_per_gpu_charts, throughput_latency_charts

__all__ = ["ECHARTS_VERSION", "Cell", "render_html"]

ECHARTS_VERSION = "6.1.0"
"""The Apache ECharts build in ``assets/echarts.min.js`` (dev/update-echarts.sh)."""
LOG_EXCERPT_LINES = 40
DEFAULT_RELOAD_S = 5


@dataclass(frozen=True)
class Cell:
    """One table cell: its text, and the number it sorts by (None: text)."""

    text: str
    sort: float | None = None
    title: str = ""

    @property
    def numeric(self) -> bool:
        return self.sort is not None

    @property
    def sort_key(self) -> str:
        return "" if self.sort is None else repr(float(self.sort))


def num(value: float | None, text: str | None = None, title: str = "") -> Cell:
    shown = text if text is not None else format_number(value)
    return Cell(shown, float(value) if value is not None else float("nan"), title)


def stats_cell(stats: MetricStats | None) -> Cell:
    if stats is None:
        return Cell("", float("nan"))
    bits = []
    if stats.lo is not None and stats.hi is not None and stats.confidence is not None:
        bits.append(
            f"{stats.confidence:.0%} interval {format_number(stats.lo)}..{format_number(stats.hi)}"
        )
    if stats.n > 1:
        bits.append(
            f"{stats.n} repeats: min {format_number(stats.min)}, max {format_number(stats.max)}"
        )
    return Cell(format_stats(stats), stats.mean, "; ".join(bits))


def _asset(name: str) -> str:
    return (resources.files("servesweep.report") / "assets" / name).read_text("utf-8")


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("servesweep.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def _json_block(value: Any) -> Markup:
    """JSON that can sit inside ``<script type="application/json">``: ``<``, ``>``
    and ``&`` are written as escapes, so no text can close the element."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return Markup(text)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{format_number(seconds)} s"
    if seconds < 7200:
        return f"{format_number(seconds / 60)} min"
    return f"{format_number(seconds / 3600)} h"


def _gpu_time(hours: float) -> str:
    """GPU time in the unit that reads best: ``3.2 GPU-h``, ``12 GPU-min``,
    ``0.11 GPU-s`` (never ``2.932e-05``)."""
    seconds = hours * 3600.0
    if seconds == 0:
        return "0"
    if hours >= 0.1:
        return f"{format_number(hours)} GPU-h"
    if seconds >= 60:
        return f"{format_number(seconds / 60)} GPU-min"
    return f"{format_number(seconds, digits=2 if seconds < 1 else 3)} GPU-s"


def _summary(data: SweepData) -> dict[str, Any]:
    counts = outcome_counts(data)
    cards = [("trials", in_plan_count(data))] + [
        (o, n) for o, n in counts.items() if n or o in ("ok", "failed", "skipped")
    ]
    if out_of_plan(data):
        cards.append(("not in plan", out_of_plan(data)))
    costs, unknown = phase_costs(data)
    rows = [
        (
            c.phase,
            num(c.seconds, _duration(c.seconds)),
            num(c.gpu_hours, _gpu_time(c.gpu_hours)),
        )
        for c in costs
    ]
    total_s = sum(c.seconds for c in costs)
    total_h = sum(c.gpu_hours for c in costs)
    return {
        "cards": cards,
        "costs": rows,
        "total": (num(total_s, _duration(total_s)), num(total_h, _gpu_time(total_h))),
        "unknown": unknown,
    }


def _best(best: BestResult | None, error: str | None) -> dict[str, Any]:
    if best is None:
        return {"decided": False, "error": error or "no objective"}
    objectives = ", ".join(f"{d} {k}" for k, d in best.objectives)
    out: dict[str, Any] = {
        "decided": True,
        "objectives": objectives,
        "constraints": "; ".join(best.constraints) or "none",
        "winner": None,
        "notes": list(best.notes),
        "excluded": [(x.label, x.reason) for x in best.excluded],
        "headers": [f"{k} ({d})" for k, d in best.objectives],
    }
    if best.winner is not None:
        win = best.winner
        held = best.costs.headline(win.trial) if best.costs else ""
        out["winner"] = {
            "label": win.label + untrusted_suffix(best),
            "lines": [
                f"{d} {k} = {format_stats(s)}"
                for (k, d), s in zip(best.objectives, win.stats, strict=True)
            ]
            + [
                f"constraint {c}: {v.describe()}"
                for c, v in zip(best.constraints, win.verdicts, strict=True)
            ]
            + (
                [f"cost: {held}"] if best.costs and (held := best.costs.headline(win.trial)) else []
            ),
            "command": win.trial.launch_command or "(launch command not recorded)",
        }
    # against the winner: tied with it, or behind it beyond uncertainty and threshold
    rows = []
    leader = best.winner
    for i, cand in enumerate(best.ranking, 1):
        pareto = " (Pareto)" if cand in best.pareto else ""
        held = best.costs.describe(cand.trial) if best.costs else ""
        pareto += f" [{held}]" if held else ""
        rows.append((i, cand.label + pareto, [stats_cell(s) for s in cand.stats],
                     Cell(_standing(best, cand)) if leader is not None else None))  # fmt: skip
    out["ranking"] = rows
    out["noise"] = leader is not None and len(best.ranking) > 1
    return out


def _standing(best: BestResult, cand: Candidate) -> str:
    """How a ranked candidate stands against the winner, in a few words."""
    win = best.winner
    assert win is not None
    if cand is win:
        return "winner" if best.decided else "winner (picked from the tie)"
    direction = best.objectives[0][1]
    lead = margin(win.stats[0], cand.stats[0], direction, best.rules)
    if cand in best.ties:
        return f"tied: #{win.trial.id} {lead.describe()}"
    return f"behind: #{win.trial.id} {lead.describe()}"


def _results(data: SweepData, index: ResultIndex, every: bool = False) -> dict[str, Any]:
    """The results table: the terminal table's default metrics (the objective's, the
    constraints', the key ones), or ``every`` metric measured."""
    params = swept_params(data)
    levels = [lvl for lv in index.levels.values() for lvl in lv]
    metrics = metric_names(levels)
    default, _ = column_priority(data, index)
    if not every:
        metrics = [m for m in default if m in metrics]
    gpus = [GPUS.name] if GPUS.name in default and GPUS.name not in params else []
    repeats = any(len(lvl.repeats) > 1 for lvl in levels)
    head = ["trial", *params, *gpus, "outcome", "workload", "level"]
    head += ["repeats"] if repeats else []
    head += [*metrics, "warnings"]
    rows: list[tuple[str, list[Cell], tuple[str, ...]]] = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        lead = [num(trial.number, f"#{trial.number}")]
        lead += [_param_cell(trial.params.get(p)) for p in params]
        lead += [_param_cell(trial_gpus(data, trial)) for _ in gpus]
        lead.append(Cell(outcome_text(trial)))
        trial_levels = index.levels.get(trial.id, [])
        if not trial_levels:
            blanks = [Cell("")] * (2 + (1 if repeats else 0) + len(metrics))
            rows.append((trial.outcome.value, [*lead, *blanks], ()))
        for lvl in trial_levels:
            level = Cell(lvl.level)
            marks: tuple[str, ...] = ()
            if lvl.unreliable:
                # the load generator could not keep time: shown, not used to decide
                level = Cell(f"{lvl.level} (unreliable)", title=lvl.unreliable)
                marks = (f"unreliable: {lvl.unreliable}",)
            ctx = lvl.acceptance
            if ctx is not None and ctx.caveat is not None:
                marks += (f"acceptance_length not trusted ({ctx.describe()}): {ctx.caveat}",)
            marks += tuple(f"config_mismatch: {describe(m)}" for m in trial_mismatches(data, trial))
            cells = [*lead, Cell(lvl.workload), level]
            cells += [num(len(lvl.repeats))] if repeats else []
            cells += [_metric_cell(lvl, m) for m in metrics]
            rows.append((trial.outcome.value, cells, marks + lvl.warnings + lvl.notes))
    return {"head": head, "rows": rows}


def _metric_cell(lvl: LevelStats, metric: str) -> Cell:
    """A metric's cell; an acceptance length measured on untrusted text says so."""
    cell = stats_cell(lvl.metrics.get(metric))
    ctx = lvl.acceptance if metric == ACCEPTANCE_LENGTH.name else None
    if ctx is None:
        return cell
    said = f"measured on {ctx.describe()}"
    if ctx.caveat is None:
        return Cell(cell.text, cell.sort, "; ".join(x for x in (cell.title, said) if x))
    return Cell(f"{cell.text} {UNTRUSTED_MARK} untrusted", cell.sort, f"{said}: {ctx.caveat}")


def _param_cell(value: object) -> Cell:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return num(float(value), format_value(value))
    return Cell(format_value(value))


_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def _same_way(trial: TrialRecord) -> tuple[str, ...]:
    """What makes two failures the same: class, reason, and the message and matched
    line with their numbers (times, PIDs, ports) left out."""
    ev = trial.evidence
    assert ev is not None
    cls = trial.failure_class.value if trial.failure_class else ""
    return (
        cls,
        ev.reason or "",
        _DIGITS.sub("N", ev.message),
        _DIGITS.sub("N", ev.matched_line or ""),
    )


def _failures(data: SweepData) -> list[dict[str, Any]]:
    """One entry per way of failing: trials that failed the same way (see
    :func:`_same_way`) share it, with the first one's evidence and every trial's log."""
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for entry, trial in _failure_entries(data):
        group = groups.get(_same_way(trial))
        if group is None:
            groups[_same_way(trial)] = entry | {"members": [entry]}
        else:
            group["members"].append(entry)
    out = list(groups.values())
    for group in out:
        members = group["members"]
        group["ids"] = ", ".join(f"#{m['id']}" for m in members)
        if len(members) > 1:
            group["facts"] = (
                [("trials", f"{len(members)} failed this way")]
                + [(f"#{m['id']}", f"{m['params']} — {m['log']}") for m in members]
                + [(k, v) for k, v in group["facts"] if k != "log"]
            )
    return out


def _failure_entries(data: SweepData) -> list[tuple[dict[str, Any], TrialRecord]]:
    out = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        ev = trial.evidence
        if trial.outcome is not Outcome.FAILED or ev is None:
            continue
        cls = trial.failure_class.value if trial.failure_class else "unclassified"
        facts: list[tuple[str, object]] = [("class", cls), ("reason", ev.reason)]
        facts += [("message", ev.message), ("exit code", ev.exit_code), ("signal", ev.signal)]
        facts += [("matched log line", ev.matched_line), ("first error line", ev.first_error_line)]
        facts += [("log", ev.log_path or trial.log_path)]
        facts += [("where", trial.lane if trial.node or trial.slot is not None else None)]
        facts += [("GPU holders", "; ".join(h.describe() for h in ev.gpu_holders) or None)]
        facts += [("processes", "; ".join(p.describe() for p in ev.processes) or None)]
        facts += [(f"{k} (s)", format_number(v)) for k, v in ev.timings.items()]
        facts += [(str(k), format_value(v)) for k, v in ev.details.items()]
        entry = {
            "id": trial.number,
            "params": " ".join(f"{k}={format_value(v)}" for k, v in trial.params.items()),
            "cls": cls,
            "summary": ev.summary(),
            "log": ev.log_path or trial.log_path or "-",
            "facts": [(k, str(v)) for k, v in facts if v is not None],
            "tail": "\n".join(ev.log_tail[-LOG_EXCERPT_LINES:]),
        }
        out.append((entry, trial))
    return out


def _evals(data: SweepData) -> dict[str, Any]:
    rates = [
        (num(r.trial_id, f"#{r.trial_id}"), r.workload, num(r.pass_rate, f"{r.pass_rate:.0%}"),
         num(r.passed), num(r.total))
        for r in eval_rates(data)
    ]  # fmt: skip
    flips = [
        (f.workload, f.task_id, ", ".join(f"#{t}: {s}" for t, s in f.statuses))
        for f in task_flips(data)
    ]
    return {"rates": rates, "flips": flips}


@dataclass(frozen=True)
class Section:
    id: str
    heading: str
    intro: str
    charts: Sequence[Chart]


def _sections(
    data: SweepData, index: ResultIndex, best: BestResult | None, now: float
) -> list[Section]:
    found = objective_ref(best)
    sections = []
    progress = progress_charts(data, index, best)
    search = is_search(data)
    if progress and search:
        # a search is judged by how fast it finds its best: that leads
        sections.append(
            Section("progress", "Search progress", "How fast the search found its best.", progress)
        )
    effects: list[Chart] = []
    if found is not None:
        heat = heatmap_chart(data, index, best)
        effects += [heat] if heat else []
        effects += metric_vs_param_charts(
            data, index, best, found[0], swept_params(data), id_prefix="chart-effect",
            direction=found[1],
        )  # fmt: skip
        for extra in (parallel_chart(data, index, best), importance_chart(data, index, best)):
            effects += [extra] if extra else []
    if effects:
        intro = "The objective against the swept parameters."
        if not any(c.id == "chart-importance" for c in effects):
            intro += f" Parameter importance appears from {MIN_TRIALS} measured trials on."
        sections.append(Section("effects", "Parameter effects", intro, effects))
    trade = throughput_latency_charts(data, index) + per_user_per_gpu_charts(data, index)
    if trade:
        sections.append(
            Section("tradeoffs", "Trade-offs", "Speed for a user vs speed for the fleet.", trade)
        )
    if progress and not search:
        # a grid runs every point in a fixed order: its progress is a footnote
        sections.append(
            Section("progress", "Progress", "The best so far as the grid ran, in its fixed "
                    "order: when the sweep reached its best.", progress)
        )  # fmt: skip
    spec = acceptance_charts(data, index, best)
    if spec:
        measured = " ".join(f"Measured on {line}." for line in acceptance_lines(index))
        sections.append(
            Section("specdecode", "Speculative decoding",
                    "Mean acceptance length (tokens per step) against the draft parameters. "
                    + measured, spec)
        )  # fmt: skip
    timeline = timeline_chart(data, now=now)
    if timeline:
        sections.append(Section("timeline", "Timeline", "", [timeline]))
    memory = memory_chart(data)
    if memory:
        sections.append(Section("memory", "GPU memory", "", [memory]))
    return sections


def _header(data: SweepData) -> dict[str, Any]:
    sweep = data.sweep
    env = dict(sweep.environment)
    engine = str(env.get("engine", ""))
    version = env.get("engine_version")
    return {
        "name": sweep.name,
        "id": sweep.id,
        "spec_path": sweep.spec_path,
        "started": _when(sweep.created_at),
        "state": f"finished {_when(sweep.finished_at)}" if sweep.finished_at else "not finished",
        "version": sweep.servesweep_version,
        "engine": f"{engine} {version}".strip() if version else engine,
        "engine_version": format_value(version) if version is not None else "",
        "environment": [(k, format_value(v)) for k, v in sorted(env.items())],
    }


def render_html(data: SweepData, *, reload_s: float | None = None) -> str:
    """The whole report as one HTML document (UTF-8 text).

    ``reload_s``: the page reloads itself every that many seconds while the sweep
    is not finished (``servesweep report --watch`` rewrites the file meanwhile).
    """
    now = time.time()
    index = ResultIndex(data)
    best: BestResult | None = None
    error: str | None = None
    try:
        best = find_best(data)
    except ServesweepError as exc:
        error = str(exc)
    sections = _sections(data, index, best, now)
    live = reload_s is not None and data.sweep.finished_at is None
    payload = {
        "trials": trial_catalog(data, index),
        "charts": [c.to_json() for s in sections for c in s.charts],
        "reload_s": reload_s if live else None,
        "rendered_at": now,
    }
    library, script, style = _asset("echarts.min.js"), _asset("report.js"), _asset("report.css")
    csp = (
        "default-src 'none'; img-src data:; "
        f"style-src '{_sha256(style)}'; "
        f"script-src '{_sha256(library)}' '{_sha256(script)}'; "
        "base-uri 'none'; form-action 'none'"
    )
    template = _environment().get_template("report.html.j2")
    return template.render(
        csp=csp,
        style=Markup(style),
        library=Markup(library),
        script=Markup(script),
        data_json=_json_block(payload),
        header=_header(data),
        summary=_summary(data),
        phase_colors=PHASE_COLORS,
        best=_best(best, error),
        predicted=predicted_table(data),
        sections=sections,
        results=_results(data, index),
        results_all=_results(data, index, every=True),
        evals=_evals(data),
        failures=_failures(data),
        live=live,
        reload_s=reload_s,
        echarts_version=ECHARTS_VERSION,
    )
