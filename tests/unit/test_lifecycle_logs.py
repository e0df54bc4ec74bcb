"""Log watching, fatal patterns and tails (files only, no processes)."""

from __future__ import annotations

from pathlib import Path

from servesweep.models import FailureClass
from servesweep.servers import logs
from servesweep.servers.engines import get_preset
from servesweep.servers.logs import log_marker

SIM = get_preset("sim")


def test_watcher_returns_complete_lines_and_keeps_the_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    w = logs.LogWatcher(path)
    assert w.read_new() == []  # no file yet
    path.write_bytes(b"one\ntw")
    assert w.read_new() == ["one"]
    assert w.progress().last_line == "tw"
    with open(path, "ab") as fh:
        fh.write(b"o\r\nthree\n")
    assert w.read_new() == ["two", "three"]
    assert w.read_new() == []
    with open(path, "ab") as fh:
        fh.write(b"tail without newline")
    assert w.flush() == ["tail without newline"]


def test_watcher_starts_after_the_instance_marker_and_survives_truncation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.log"
    path.write_text(
        f"=== {log_marker('a-1-aa')} at x\nerror: unrecognized arguments: --old\n"
        f"=== {log_marker('a-1-bb')} at y\nloading\n"
    )
    w = logs.LogWatcher(path, start_after=log_marker("a-1-bb"))
    assert w.read_new() == ["loading"]
    path.write_text("fresh\n")  # truncated and rewritten
    assert w.read_new() == ["fresh"]


def test_match_fatal_prefers_the_specific_pattern_over_a_traceback() -> None:
    lines = [
        "INFO loading",
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB",
    ]
    match = logs.match_fatal(lines, SIM.fatal_patterns)
    assert match is not None
    assert match.pattern.reason == "oom"
    assert match.pattern.failure_class is FailureClass.START_CRASH
    assert match.line.startswith("torch.OutOfMemoryError")
    argparse_line = "sim: error: unrecognized arguments: --bogus"
    match = logs.match_fatal(["usage: sim", argparse_line], SIM.fatal_patterns)
    assert match is not None and match.pattern.failure_class is FailureClass.INVALID_ARGS
    assert logs.match_fatal(["all good", "Uvicorn running"], SIM.fatal_patterns) is None


def test_tail_reads_the_last_lines_of_a_large_file(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(20000)))
    assert logs.tail(path, 3) == ["line 19997", "line 19998", "line 19999"]
    assert logs.tail(tmp_path / "missing.log", 3) == []
    assert logs.tail(None, 3) == []
