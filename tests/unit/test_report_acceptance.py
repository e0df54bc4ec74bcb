"""Acceptance lengths that cannot be trusted (measured on random-token prompts or with
ignore_eos) are marked in every report, and ``best`` says when its winner rests on one."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from typing import Any

from rich.console import Console

from helpers.report_data import level, sweep_data, trial
from servesweep.bench.standalone import format_results
from servesweep.decide.acceptance import AcceptanceContext
from servesweep.decide.best import find_best
from servesweep.records import SweepData
from servesweep.report import render
from servesweep.report.best_view import best_to_json, format_best


def _ctx(dataset: str, ignore_eos: bool) -> dict[str, Any]:
    return AcceptanceContext(dataset, ignore_eos, "chat").to_info()


def _spec_sweep(*, stored: bool = True) -> SweepData:
    """Two draft settings; ``real`` (builtin:coding) is trusted, ``fast`` ran with
    ignore_eos on random-token prompts. ``stored``: the levels carry their
    acceptance_context (False: only dataset and ignore_eos, as older levels did)."""

    def lvl(workload: str, dataset: str, ignore: bool, acc: float, tput: float) -> Any:
        info: dict[str, Any] = {"dataset": dataset, "ignore_eos": ignore}
        if stored:
            info["acceptance_context"] = _ctx(dataset, ignore)
        res = level(workload, "c4", acceptance_length=acc, output_throughput=tput)
        return dataclasses.replace(res, info=info)

    trials = [trial(1, {"draft": 2}), trial(2, {"draft": 4})]
    results = {
        1: [lvl("real", "builtin:coding", False, 2.1, 300.0),
            lvl("fast", "synthetic", True, 3.9, 520.0)],
        2: [lvl("real", "builtin:coding", False, 2.6, 360.0),
            lvl("fast", "synthetic", True, 1.2, 280.0)],
    }  # fmt: skip
    return sweep_data(trials, results)


def test_table_marks_untrusted_acceptance_and_says_what_it_was_measured_on() -> None:
    for stored in (True, False):
        text = render(_spec_sweep(stored=stored), "table", width=250)
        rows = [line for line in text.splitlines() if " c4 " in line]
        assert any("fast" in r and "3.9?" in r for r in rows), text
        assert any("real" in r and "2.1 " in r and "2.1?" not in r for r in rows), text
        assert "acceptance_length measured on:" in text
        assert "real: dataset builtin:coding" in text
        assert "fast: dataset synthetic" in text and "ignore_eos; ? not trusted:" in text
        assert "random-token prompts" in text
    markdown = render(_spec_sweep(), "markdown")
    assert "### acceptance\\_length measured on" in markdown
    assert "3.9?" in markdown


def test_best_on_an_untrusted_acceptance_figure_says_so() -> None:
    data = _spec_sweep()
    direct = find_best(data, "fast.c4.acceptance_length")
    assert direct.trial is not None and direct.trial.id == 1
    (flag,) = direct.untrusted
    assert flag.direct and flag.context.dataset == "synthetic"
    text = format_best(direct)
    assert "(? decided on an untrusted acceptance figure: see note)" in text.splitlines()[0]
    assert "note: untrusted acceptance (?): fast.c4.acceptance_length decides here" in text
    payload = best_to_json(direct)["decision"]
    assert payload["acceptance_trusted"] is False
    assert payload["untrusted_acceptance"][0]["metric"] == "fast.c4.acceptance_length"
    assert payload["untrusted_acceptance"][0]["ignore_eos"] is True
    # a speed measured with speculative decoding on such text is flagged too
    speed = find_best(data, "fast.c4.output_throughput")
    assert [u.direct for u in speed.untrusted] == [False]
    assert "speed-up the draft brought there is not what real traffic gets" in format_best(speed)
    # and a constraint read on it
    constrained = find_best(
        data, "real.c4.output_throughput", constraints=["fast.c4.acceptance_length > 1"]
    )
    assert [u.ref for u in constrained.untrusted] == ["fast.c4.acceptance_length"]
    # decided on real text only: nothing to say
    trusted = find_best(data, "real.c4.acceptance_length")
    assert trusted.untrusted == () and "untrusted" not in format_best(trusted)
    assert best_to_json(trusted)["decision"]["acceptance_trusted"] is True
    # the table's best line carries the mark as well
    assert "untrusted" not in render(data, "table", width=250).split("best (")[1]
    data = dataclasses.replace(data, objective={"maximize": "fast.c4.output_throughput"})
    table = render(data, "table", width=250).split("best (")[1]
    assert "#1 draft=2 = 520 (? decided with speculative decoding on an untrusted" in table


def test_best_says_once_per_workload_which_of_its_figures_are_untrusted() -> None:
    data = _spec_sweep()
    result = find_best(
        data,
        "fast.c4.output_throughput",
        constraints=["fast.c4.acceptance_length > 1"],
    )
    assert [u.ref for u in result.untrusted] == [
        "fast.c4.output_throughput",
        "fast.c4.acceptance_length",
    ]
    notes = [n for n in result.notes if n.startswith("untrusted acceptance")]
    assert len(notes) == 1, result.notes
    (note,) = notes
    assert "fast.c4.acceptance_length decides here but was measured on" in note
    assert "; fast.c4.output_throughput was measured with speculative decoding on" in note
    assert format_best(result).count("untrusted acceptance (?)") == 1


def test_csv_and_json_say_which_dataset_and_mode() -> None:
    data = _spec_sweep()
    rows = list(csv.DictReader(io.StringIO(render(data, "csv"))))
    by = {(r["trial"], r["workload"]): r for r in rows}
    assert by[("1", "fast")]["acceptance_dataset"] == "synthetic"
    assert by[("1", "fast")]["acceptance_ignore_eos"] == "true"
    assert by[("1", "fast")]["acceptance_trusted"] == "false"
    assert by[("1", "real")]["acceptance_trusted"] == "true"
    assert by[("1", "real")]["acceptance_endpoint"] == "chat"
    doc = json.loads(render(data, "json"))
    trial1 = doc["trials"][0]
    contexts = {r["workload"]: r["acceptance_context"] for r in trial1["results"]}
    assert contexts["fast"]["trusted"] is False and "caveat" in contexts["fast"]
    assert contexts["real"] == {
        "dataset": "builtin:coding",
        "ignore_eos": False,
        "trusted": True,
        "endpoint": "chat",
    }
    aggregates = {a["workload"]: a["acceptance_context"] for a in trial1["aggregates"]}
    assert aggregates["fast"]["trusted"] is False
    # no acceptance length, no context, no columns
    plain = sweep_data([trial(1, {"a": 1})], {1: [level("chat", "c1", output_throughput=5.0)]})
    assert "acceptance_trusted" not in render(plain, "csv").splitlines()[0]


def test_html_marks_the_untrusted_cell_and_the_speculative_section() -> None:
    page = render(_spec_sweep(), "html")
    assert "3.9 ? untrusted" in page
    assert "acceptance_length not trusted (dataset synthetic, chat endpoint, ignore_eos)" in page
    assert "Measured on fast: dataset synthetic, chat endpoint, ignore_eos; ? not trusted" in page


def test_bench_table_marks_untrusted_acceptance() -> None:
    res = dataclasses.replace(
        level("chat", "c1", completed=4, acceptance_length=2.5),
        info={
            "acceptance_source": "engine_counters",
            "acceptance_context": _ctx("synthetic", False),
        },
    )
    console = Console(width=250, record=True)
    console.print(format_results([res]))
    text = console.export_text()
    assert "2.50 counters ?" in text
    assert "? (dataset synthetic, chat endpoint): acceptance length measured on random" in text
    trusted = dataclasses.replace(
        res, info={"acceptance_source": "engine_counters", "acceptance_context": _ctx("x", False)}
    )
    console = Console(width=250, record=True)
    console.print(format_results([trusted]))
    assert "counters ?" not in console.export_text()
