"""The HTML report: one self-contained file that works offline.

No CDN, no external request: styles and the small sorting script are inlined, the
plots are inline SVG, and a Content-Security-Policy forbids loading anything and
running any script but ours (allowed by its hash). Everything that came from a
server, a model, a log or the sweep file is escaped with :func:`html.escape`.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import time
from html import escape
from importlib import resources

from servesweep.errors import ServesweepError
from servesweep.models import Outcome
from servesweep.report.best import BestResult, find_best
from servesweep.report.data import (
    format_number,
    format_stats,
    format_value,
    metric_names,
    outcome_counts,
    phase_costs,
    swept_params,
)
from servesweep.report.evals import eval_rates, task_flips
from servesweep.report.plots import (
    PHASE_COLORS,
    memory_plot,
    objective_plots,
    throughput_latency_plots,
    timeline_plot,
)
from servesweep.report.refs import ResultIndex
from servesweep.spec.constraints import parse_metric_ref
from servesweep.store.records import SweepData, TrialRecord

__all__ = ["render_html"]

LOG_EXCERPT_LINES = 40


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _asset(name: str) -> str:
    return (resources.files("servesweep.report") / "assets" / name).read_text("utf-8")


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num_cell(value: float | None, text: str | None = None, title: str = "") -> str:
    v = "" if value is None else repr(float(value))
    t = f' title="{_e(title)}"' if title else ""
    shown = text if text is not None else format_number(value)
    return f'<td class="n" data-v="{_e(v)}"{t}>{_e(shown)}</td>'


def _outcome_text(trial: TrialRecord) -> str:
    if trial.outcome is Outcome.FAILED:
        cls = trial.failure_class.value if trial.failure_class else "unclassified"
        return f"failed: {cls}"
    return str(trial.outcome.value)


def _header(data: SweepData) -> str:
    sweep = data.sweep
    state = f"finished {_when(sweep.finished_at)}" if sweep.finished_at else "not finished"
    env = "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(format_value(v))}</td></tr>"
        for k, v in sorted(sweep.environment.items())
    )
    return (
        f"<h1>servesweep report: {_e(sweep.name)}</h1>"
        f'<p class="muted">sweep #{_e(sweep.id)} from {_e(sweep.spec_path)}; '
        f"started {_e(_when(sweep.created_at))}, {_e(state)}; "
        f"servesweep {_e(sweep.servesweep_version)}</p>"
        + (f"<details><summary>environment</summary><table>{env}</table></details>" if env else "")
    )


def _summary(data: SweepData) -> str:
    counts = outcome_counts(data)
    cards = [f'<div class="card"><b>{len(data.trials)}</b>trials</div>']
    cards += [
        f'<div class="card {_e(o)}"><b>{n}</b>{_e(o)}</div>'
        for o, n in counts.items()
        if n or o in ("ok", "failed", "skipped")
    ]
    costs, unknown = phase_costs(data)
    rows = "".join(
        f'<tr><th><i style="background:{PHASE_COLORS.get(c.phase, "#bbb")}"></i> {_e(c.phase)}'
        f"</th>{_num_cell(c.seconds, _duration(c.seconds))}"
        f"{_num_cell(c.gpu_hours, f'{c.gpu_hours:.3f}')}</tr>"
        for c in costs
    )
    total_s = sum(c.seconds for c in costs)
    total_h = sum(c.gpu_hours for c in costs)
    note = (
        f'<p class="muted">{unknown} trial(s) with an unknown GPU count are counted as one GPU.</p>'
        if unknown
        else ""
    )
    return (
        '<h2 id="summary">Summary</h2>'
        f'<div class="cards">{"".join(cards)}</div>'
        '<table class="legend"><thead><tr><th>phase</th><th>wall time</th>'
        f"<th>GPU-hours</th></tr></thead><tbody>{rows}"
        f"<tr><th>total</th>{_num_cell(total_s, _duration(total_s))}"
        f"{_num_cell(total_h, f'{total_h:.3f}')}</tr>"
        f"</tbody></table>{note}"
        '<p class="muted">GPU-hours: phase seconds x the GPUs the trial held / 3600.</p>'
    )


def _best(best: BestResult | None, error: str | None) -> str:
    out = ['<h2 id="best">Best configuration</h2>']
    if best is None:
        return out[0] + f'<div class="none">not decided: {_e(error or "no objective")}</div>'
    objs = ", ".join(f"{d} {k}" for k, d in best.objectives)
    cons = "; ".join(best.constraints) or "none"
    if best.winner is None:
        out.append(
            f'<div class="none"><b>no feasible configuration</b> for {_e(objs)} under '
            f"constraints {_e(cons)}.</div>"
        )
    else:
        win = best.winner
        values = "".join(
            f"<li>{_e(d)} {_e(k)} = <b>{_e(format_stats(s))}</b></li>"
            for (k, d), s in zip(best.objectives, win.stats, strict=True)
        )
        values += "".join(
            f"<li>constraint {_e(c)}: {_e(format_number(v))} (met)</li>"
            for c, v in zip(best.constraints, win.constraint_values, strict=True)
        )
        command = win.trial.launch_command or "(launch command not recorded)"
        out.append(
            f'<div class="best"><p><b>{_e(win.label)}</b></p><ul>{values}</ul>'
            f"<p>launch command:</p><pre><code>{_e(command)}</code></pre></div>"
        )
    out += [f'<p class="flag">note: {_e(n)}</p>' for n in best.notes]
    if best.ranking:
        head = "".join(f"<th>{_e(k)} ({_e(d)})</th>" for k, d in best.objectives)
        top = best.ranking[0]
        rows = []
        for i, cand in enumerate(best.ranking, 1):
            cells = "".join(
                _num_cell(s.mean, format_stats(s), _spread_title(s.min, s.max, s.n))
                for s in cand.stats
            )
            noise = [s for s in (top.stats[0].spread, cand.stats[0].spread) if s is not None]
            flag = ""
            if i > 1 and noise and abs(cand.values[0] - top.values[0]) <= max(noise):
                flag = '<span class="flag">within noise of #1</span>'
            pareto = " Pareto" if cand in best.pareto else ""
            rows.append(
                f"<tr><td>{i}</td><td>{_e(cand.label)}{_e(pareto)}</td>{cells}<td>{flag}</td></tr>"
            )
        out.append(
            f'<table class="sortable"><thead><tr><th>rank</th><th>configuration</th>{head}'
            f"<th>noise</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
    if best.excluded:
        items = "".join(f"<li>{_e(x.label)}: {_e(x.reason)}</li>" for x in best.excluded)
        out.append(f"<details open><summary>excluded ({len(best.excluded)})</summary>")
        out.append(f"<ul>{items}</ul></details>")
    out.append(f'<p class="muted">objective: {_e(objs)}; constraints: {_e(cons)}</p>')
    return "".join(out)


def _spread_title(lo: float, hi: float, n: int) -> str:
    return f"{n} repeats: min {format_number(lo)}, max {format_number(hi)}" if n > 1 else ""


def _plots(data: SweepData, index: ResultIndex, best: BestResult | None) -> str:
    objective = None
    if best is not None and best.objectives:
        objective = parse_metric_ref(best.objectives[0][0])
    charts = objective_plots(data, index, best, objective)
    charts += throughput_latency_plots(data, index)
    out = ['<h2 id="plots">Plots</h2>']
    if charts:
        out.append(f'<div class="plots">{"".join(charts)}</div>')
        out.append(
            '<p class="muted">filled: feasible; hollow: excluded by a constraint; '
            "ringed: the best (objective plots) or on the Pareto front; red cross: failed.</p>"
        )
    timeline = timeline_plot(data, now=time.time())
    if timeline:
        legend = "".join(
            f'<span><i style="background:{color}"></i>{_e(phase)}</span>'
            for phase, color in PHASE_COLORS.items()
        )
        out.append(f'<h2 id="timeline">Timeline</h2><p class="legend">{legend}</p>{timeline}')
    memory = memory_plot(data)
    if memory:
        out.append(f'<h2 id="memory">GPU memory</h2>{memory}')
    return "".join(out)


def _results_table(data: SweepData, index: ResultIndex) -> str:
    params = swept_params(data)
    levels = [lvl for lv in index.levels.values() for lvl in lv]
    metrics = metric_names(levels)
    head = ["trial", *params, "outcome", "workload", "level", "repeats", *metrics, "warnings"]
    rows: list[str] = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        lead = _num_cell(trial.id, f"#{trial.id}") + "".join(
            _param_cell(trial.params.get(p)) for p in params
        )
        lead += f"<td>{_e(_outcome_text(trial))}</td>"
        cls = f' class="row-{_e(trial.outcome.value)}"'
        trial_levels = index.levels.get(trial.id, [])
        if not trial_levels:
            blanks = "<td></td>" * (3 + len(metrics) + 1)
            rows.append(f"<tr{cls}>{lead}{blanks}</tr>")
        for lvl in trial_levels:
            cells = "".join(
                _num_cell(s.mean, format_stats(s), _spread_title(s.min, s.max, s.n))
                if (s := lvl.metrics.get(m)) is not None
                else "<td></td>"
                for m in metrics
            )
            rows.append(
                f"<tr{cls}>{lead}<td>{_e(lvl.workload)}</td><td>{_e(lvl.level)}</td>"
                f"{_num_cell(len(lvl.repeats))}{cells}{_warnings_cell(lvl.warnings)}</tr>"
            )
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    return (
        '<h2 id="results-h">Results</h2><p class="muted">Click a column to sort. Values are '
        "means over repeats; ± is the standard deviation across repeats.</p>"
        f'<div class="scroll"><table id="results" class="sortable"><thead><tr>{header}</tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _warnings_cell(warnings: tuple[str, ...]) -> str:
    if not warnings:
        return '<td class="n" data-v="0"></td>'
    items = "".join(f"<li>{_e(w)}</li>" for w in warnings)
    return (
        f'<td class="warn" data-v="{len(warnings)}"><details><summary>{len(warnings)} '
        f"warning{'s' if len(warnings) > 1 else ''}</summary><ul>{items}</ul></details></td>"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _param_cell(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _num_cell(float(value), format_value(value))
    return f"<td>{_e(format_value(value))}</td>"


def _evals(data: SweepData) -> str:
    rates = eval_rates(data)
    if not rates:
        return ""
    rows = "".join(
        f"<tr>{_num_cell(r.trial_id, f'#{r.trial_id}')}<td>{_e(r.workload)}</td>"
        f"{_num_cell(r.pass_rate, f'{r.pass_rate:.0%}')}{_num_cell(r.passed)}"
        f"{_num_cell(r.total)}</tr>"
        for r in rates
    )
    out = (
        '<h2 id="evals">Correctness</h2><table class="sortable"><thead><tr><th>trial</th>'
        "<th>workload</th><th>pass rate</th><th>passed</th><th>samples</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    flips = task_flips(data)
    if flips:
        items = "".join(
            f"<tr><td>{_e(f.workload)}</td><td>{_e(f.task_id)}</td><td>"
            + ", ".join(f"#{t}: {_e(s)}" for t, s in f.statuses)
            + "</td></tr>"
            for f in flips
        )
        out += (
            "<p>Tasks that flipped between configurations:</p><table><thead><tr>"
            "<th>workload</th><th>task</th><th>status per trial</th></tr></thead>"
            f"<tbody>{items}</tbody></table>"
        )
    return out


def _failures(data: SweepData) -> str:
    failed = [t for t in sorted(data.trials, key=lambda t: (t.seq, t.id)) if t.evidence]
    failed = [t for t in failed if t.outcome is Outcome.FAILED]
    if not failed:
        return ""
    out = ['<h2 id="failures">Failures</h2>']
    for trial in failed:
        ev = trial.evidence
        assert ev is not None
        cls = trial.failure_class.value if trial.failure_class else "unclassified"
        facts: list[tuple[str, object]] = [("class", cls), ("reason", ev.reason)]
        facts += [("message", ev.message)]
        facts += [("exit code", ev.exit_code), ("signal", ev.signal)]
        facts += [("matched log line", ev.matched_line), ("log", ev.log_path or trial.log_path)]
        facts += [("GPU holders", "; ".join(h.describe() for h in ev.gpu_holders) or None)]
        facts += [("processes", "; ".join(p.describe() for p in ev.processes) or None)]
        facts += [(f"{k} (s)", format_number(v)) for k, v in ev.timings.items()]
        facts += [(str(k), format_value(v)) for k, v in ev.details.items()]
        rows = "".join(
            f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts if v is not None
        )
        tail = ev.log_tail[-LOG_EXCERPT_LINES:]
        excerpt = f"<pre>{_e(chr(10).join(tail))}</pre>" if tail else ""
        params = " ".join(f"{k}={format_value(v)}" for k, v in trial.params.items())
        out.append(
            f"<details open><summary><b>#{trial.id}</b> {_e(params)}: "
            f'<span class="failed">{_e(cls)}</span> — {_e(ev.summary())}</summary>'
            f"<table>{rows}</table>{excerpt}</details>"
        )
    return "".join(out)


def render_html(data: SweepData) -> str:
    """The whole report as one HTML document (UTF-8 text)."""
    index = ResultIndex(data)
    best: BestResult | None = None
    error: str | None = None
    try:
        best = find_best(data)
    except ServesweepError as exc:
        error = str(exc)
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'"
    )
    body = "".join(
        [
            _header(data),
            _summary(data),
            _best(best, error),
            _plots(data, index, best),
            _results_table(data, index),
            _evals(data),
            _failures(data),
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(csp)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>servesweep: {_e(data.sweep.name)}</title>"
        f"<style>{_asset('report.css')}</style></head>\n"
        f"<body>{body}<script>{script}</script></body></html>\n"
    )
