"""Text formats of the report: table, Markdown, CSV and the versioned JSON."""

from __future__ import annotations

import csv
import io
import json

import pytest

from helpers.report_data import level, sweep_data, throughput_sweep, trial
from servesweep.decide.best import find_best
from servesweep.errors import ConfigError
from servesweep.models import Evidence
from servesweep.records import SweepData
from servesweep.report import FORMATS, JSON_FORMAT, JSON_VERSION, format_best, render


def test_table_lists_every_level_failure_and_best() -> None:
    text = render(throughput_sweep(), "table")
    assert "\x1b[" not in text  # plain without color
    lines = text.splitlines()
    assert lines[0] == "sweep demo (#1): 4 trials, 3 ok, 1 failed"
    rows = [ln for ln in lines if ln.startswith("│ #")]
    assert len(rows) == 10  # 3 ok trials x (chat c1, chat c8, coding) + 1 failed
    assert any("#4" in r and "failed start_crash (oom)" in r for r in rows)
    assert "failures:" in lines
    assert any("#4 start_crash: (oom) server exited while loading" in ln for ln in lines)
    assert "  flipped coding/t3: #1 fail, #2 pass, #3 fail" in lines
    assert lines[-2] == "best (max chat.c1.output_throughput): #2 budget=8 topk=4 = 150"
    assert lines[-1].startswith("note: #2 beats the runner-up #1 on chat.c1.output_throughput")
    # the eval's pass rates carry Wilson intervals: the table says what ± means
    assert "±: half the 95% confidence interval, from the level's requests and its repeats" in (
        lines
    )
    assert all(ln == ln.rstrip() for ln in lines)


def test_table_color_and_no_markup_injection() -> None:
    data = sweep_data(
        [trial(1, {"flag": "[bold red]x[/]"}), trial(2, {"flag": "[link=http://e]y"})],
        {
            1: [level("chat", "c1", output_throughput=1.0)],
            2: [level("chat", "c1", output_throughput=2.0)],
        },
    )
    plain = render(data, "table")
    assert "[bold red]x[/]" in plain and "[link=http://e]y" in plain
    colored = render(data, "table", color=True)
    assert "\x1b[" in colored


def test_table_shows_repeat_spread() -> None:
    data = sweep_data(
        [trial(1, {"b": 1})],
        {1: [level("chat", "c1", r, output_throughput=v) for r, v in enumerate((10.0, 12.0))]},
    )
    text = render(data, "table")
    # the interval of the mean of two repeats, 10 and 12: 11 ± 1.96 x 1.414 / sqrt(2)
    assert "│ 2 │             11 ±2 │" in text
    assert "┃ level ┃ n ┃ output_throughput ┃" in text


def test_markdown_escapes_cells() -> None:
    data = sweep_data([trial(1, {"x": "a|b"})], {1: [level("chat", "c1", output_throughput=5.0)]})
    md = render(data, "markdown")
    header = next(ln for ln in md.splitlines() if ln.startswith("| trial"))
    assert header == "| trial | x | outcome | workload | level | output\\_throughput |"
    assert "| #1 | a\\|b | ok | chat | c1 | 5 |" in md


def test_csv_one_row_per_trial_workload_level_repeat() -> None:
    data = throughput_sweep()
    rows = list(csv.DictReader(io.StringIO(render(data, "csv"))))
    assert len(rows) == 10
    first = rows[0]
    assert first["trial"] == "1" and first["param_budget"] == "4" and first["param_topk"] == "2"
    assert first["workload"] == "chat" and first["level"] == "c1" and first["repeat"] == "0"
    assert float(first["output_throughput"]) == 100.0
    assert float(first["load_s"]) == 20.0
    failed = [r for r in rows if r["outcome"] == "failed"]
    assert len(failed) == 1 and failed[0]["failure_class"] == "start_crash"
    assert failed[0]["failure_reason"] == "oom" and failed[0]["workload"] == ""
    header = next(csv.reader(io.StringIO(render(data, "csv"))))
    for metric in ("output_throughput", "ttft_p99_ms", "tpot_median_ms", "pass_rate"):
        assert metric in header


def test_csv_repeats_and_formula_injection() -> None:
    data = sweep_data(
        [trial(1, {"cmd": "=HYPERLINK(1)", "n": -3})],
        {1: [level("chat", "c1", r, output_throughput=float(r)) for r in range(3)]},
    )
    rows = list(csv.DictReader(io.StringIO(render(data, "csv"))))
    assert [r["repeat"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["param_cmd"] == "'=HYPERLINK(1)"
    assert rows[0]["param_n"] == "-3"


def test_json_document_shape() -> None:
    doc = json.loads(render(throughput_sweep(), "json"))
    assert doc["format"] == JSON_FORMAT == "servesweep-report"
    assert doc["version"] == JSON_VERSION == 1
    assert doc["sweep"]["name"] == "demo"
    assert doc["summary"]["outcomes"]["ok"] == 3 and doc["summary"]["outcomes"]["failed"] == 1
    # 3 trials x 30 s bench (trial 4 never reached bench), 2 GPUs each
    assert doc["summary"]["phase_seconds"]["bench"] == 90.0
    assert doc["summary"]["gpu_hours"]["bench"] == pytest.approx(90.0 * 2 / 3600)
    assert doc["summary"]["gpu_hours"]["load"] == pytest.approx(72.0 * 2 / 3600)
    trials = {t["id"]: t for t in doc["trials"]}
    assert trials[4]["failure"]["reason"] == "oom"
    assert trials[4]["failure"]["summary"].startswith("(oom) server exited")
    assert trials[1]["peak_gpu_memory_bytes"] == {"0": 72_000 * 2**20, "1": 72_000 * 2**20}
    agg = trials[2]["aggregates"][0]
    assert agg["workload"] == "chat" and agg["metrics"]["output_throughput"]["mean"] == 150.0
    assert doc["best"]["best"]["trial"] == 2
    assert doc["evals"]["flipped"][0] == {
        "workload": "coding",
        "task_id": "t2",
        "statuses": {"1": "pass", "2": "pass", "3": "fail"},
    }


def test_json_has_no_nan_and_reports_best_errors() -> None:
    data = sweep_data(
        [trial(1, {"b": 1}, evidence=Evidence("x"))],
        {1: [level("chat", "c1", output_throughput=float("nan"), ttft_p99_ms=float("inf"))]},
        objective={"maximize": "chat.c1.output_throughput"},
    )
    text = render(data, "json")
    doc = json.loads(text)
    assert doc["trials"][0]["results"][0]["metrics"] == {
        "output_throughput": None,
        "ttft_p99_ms": None,
    }
    assert doc["best"]["feasible"] is False
    bad = sweep_data([], {}, objective={"maximize": "not a ref!"})
    assert json.loads(render(bad, "json"))["best_error"].startswith("not a metric reference")


def test_every_format_renders_an_empty_sweep() -> None:
    empty = sweep_data([], {})
    for fmt in FORMATS:
        assert render(empty, fmt)
    assert render(empty, "md") == render(empty, "markdown")
    with pytest.raises(ConfigError, match="unknown report format"):
        render(empty, "pdf")


def test_terminal_escapes_from_logs_are_neutralised() -> None:
    evil = Evidence("boom \x1b]0;owned\x07 \x1b[2J\x1b[31mred\r\u202e", log_path="x.log")
    data = sweep_data(
        [
            trial(1, {"b": "\x1b[2Jx"}, "failed", failure="start_crash", evidence=evil),
            trial(2, {"b": "ok"}),
        ],
        {2: [level("chat", "c1", output_throughput=1.0)]},
        objective={"maximize": "chat.c1.output_throughput"},
    )
    for text in (render(data, "table"), render(data, "markdown"), format_best(find_best(data))):
        assert "\x1b" not in text and "\x07" not in text and "\r" not in text
        assert "\u202e" not in text
        assert "x1b" in text  # shown, as text
    assert "\\x1b]0;owned\\x07" in render(data, "table")


def test_csv_header_names_each_column_once() -> None:
    """The load generator reports the level's duration as a metric too; the CSV has
    one ``duration_s`` column, the level's."""
    data = sweep_data(
        [trial(1, {"b": 1})],
        {1: [level("chat", "c1", output_throughput=5.0, duration_s=10.0, load_s=3.0)]},
    )
    header = next(csv.reader(io.StringIO(render(data, "csv"))))
    assert len(header) == len(set(header)), sorted(h for h in header if header.count(h) > 1)
    row = next(csv.DictReader(io.StringIO(render(data, "csv"))))
    assert float(row["duration_s"]) == 10.0 and float(row["output_throughput"]) == 5.0


def _wide_sweep() -> SweepData:
    metrics = {
        "output_throughput": 1234.5, "ttft_p99_ms": 25.25, "tpot_median_ms": 4.004,
        "ttft_median_ms": 20.5, "itl_p99_ms": 9.5, "e2e_median_ms": 200.25,
        "request_throughput": 3.5, "acceptance_length": 2.75, "goodput": 3.0,
    }  # fmt: skip
    return sweep_data(
        [trial(1, {"budget": 4, "topk": 2}), trial(2, {"budget": 8, "topk": 4})],
        {1: [level("chat", "c1", **metrics)], 2: [level("chat", "c1", **metrics)]},
        objective={"maximize": "chat.c1.output_throughput"},
        constraints=["chat.c1.ttft_p99_ms < 500"],
    )


def test_table_columns_by_priority_to_fit_the_width() -> None:
    data = _wide_sweep()
    for width in (200, 120, 90, 60):
        text = render(data, "table", width=width)
        table = [ln for ln in text.splitlines() if ln[:1] in "┏┃┡│└"]
        assert max(len(ln) for ln in table) <= width, width
    wide = render(data, "table", width=200)
    header = next(ln for ln in wide.splitlines() if ln.startswith("┃"))
    names = [c.strip() for c in header.strip("┃").split("┃")]
    assert names[:8] == ["trial", "budget", "topk", "outcome", "workload", "level",
                         "output_throughput", "ttft_p99_ms"]  # fmt: skip
    assert names[8] == "acceptance_length"  # measured: a default column, before the rest
    assert "hidden to fit" not in wide  # every default column fits in 200
    assert (
        "1 more metric measured (not default columns). See them with --columns NAME,... "
        "(e.g. --columns goodput), or --format csv / json / html" in wide
    )
    narrow = render(data, "table", width=90)
    header = next(ln for ln in narrow.splitlines() if ln.startswith("┃"))
    assert "output_throughput" in header and "budget" in header  # the objective first
    assert "e2e_median_ms" not in header
    hidden = next(ln for ln in narrow.splitlines() if "hidden to fit 90 characters" in ln)
    assert hidden.startswith(f"{hidden.split()[0]} columns hidden") and "--columns" in hidden
    assert "e2e_median_ms" in hidden and "COLUMNS=250" in hidden
    chosen = render(data, "table", width=60, columns=["goodput"])
    header = next(ln for ln in chosen.splitlines() if ln.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == [
        "trial", "outcome", "workload", "level", "goodput",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="no column 'bogus'"):
        render(data, "table", columns=["bogus"])


def test_numbers_use_significant_digits_everywhere() -> None:
    from servesweep.report import format_number

    assert [format_number(v) for v in (1234.5, 25.25, 4.004, 0.012345, 123456.7, 30.0)] == [
        "1234", "25.25", "4.004", "0.01235", "123457", "30",
    ]  # fmt: skip
    data = _wide_sweep()
    for fmt in ("table", "markdown"):
        text = render(data, fmt, width=250)
        assert "1234" in text and "1234.5" not in text, fmt
    html = render(data, "html")  # shown text; sort keys and chart data keep full precision
    assert ">1234</td>" in html and ">1234.5<" not in html and '"1234"' in html


def test_trials_no_longer_in_the_sweep_file_are_counted_apart_and_marked() -> None:
    """An edited grid: 3 trials of the plan, 2 measured before the edit removed them."""
    trials = [trial(n, {"budget": n}, in_plan=n <= 3) for n in range(1, 6)]
    results = {n: [level("chat", "c1", output_throughput=10.0 * n)] for n in range(1, 6)}
    data = sweep_data(trials, results, objective={"maximize": "chat.c1.output_throughput"})
    lines = render(data, "table").splitlines()
    assert lines[0] == (
        "sweep demo (#1): 3 trials, 3 ok; 2 more no longer in the sweep file (marked not in plan)"
    )
    marked = [ln for ln in lines if "ok, not in plan" in ln]
    assert [ln.split()[1] for ln in marked] == ["#4", "#5"]
    rows = list(csv.DictReader(io.StringIO(render(data, "csv"))))
    assert [r["in_plan"] for r in rows] == ["1", "1", "1", "0", "0"]
    summary = json.loads(render(data, "json"))["summary"]
    assert summary["trials"] == 3 and summary["not_in_plan"] == 2
    assert summary["outcomes"]["ok"] == 3
    html = render(data, "html")
    assert "<b>3</b>trials</div>" in html and "<b>2</b>not in plan</div>" in html
    assert html.count("<td>ok, not in plan</td>") == 2  # the results table's rows


def test_a_reason_that_repeats_its_class_is_said_once() -> None:
    evidence = Evidence("port 8000 is in use by pid 7 (nc)", reason="port_in_use")
    data = sweep_data([trial(1, {"b": 1}, "failed", failure="port_in_use", evidence=evidence)], {})
    text = render(data, "table")
    assert "failed port_in_use " in text and "(port_in_use)" not in text
    assert "#1 port_in_use: port 8000 is in use by pid 7 (nc)" in text


def test_at_80_columns_the_constraints_metric_beats_a_constant_workload_column() -> None:
    trials = [trial(n, {"budget": 4 * n, "topk": n}) for n in range(1, 4)]
    results = {
        n: [level("chat", lvl, output_throughput=990.5 + n, ttft_p99_ms=30.25, itl_p99_ms=8.5)
            for lvl in ("c1", "c8")]
        for n in range(1, 4)
    }  # fmt: skip
    data = sweep_data(
        trials,
        results,
        objective={"maximize": "chat.c1.output_throughput"},
        constraints=["chat.c1.ttft_p99_ms < 500"],
    )
    lines = render(data, "table", width=80).splitlines()
    header = next(ln for ln in lines if ln.startswith("┃"))
    assert "ttft_p99_ms" in header and "workload" not in header
    assert lines[0].endswith("; every row: workload chat")
    assert all(len(ln) <= 80 for ln in lines if ln[:1] in "┃│┏┗┡└")
    wide = render(data, "table", width=200).splitlines()
    assert "workload" in next(ln for ln in wide if ln.startswith("┃"))  # room enough: kept
