"""Which journal entries are one systemd invocation's output (``journal.Invocation``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servesweep.servers.launchers.journal import Invocation

INV = "6f4afe6b7d4746869f41178d0c1aae6a"
STARTED = 1796594554.4
AFTER = str(int((STARTED + 0.1) * 1e6))
BEFORE = str(int((STARTED - 5.0) * 1e6))

UNTAGGED = {
    "MESSAGE": "torch.OutOfMemoryError: CUDA out of memory.",
    "_PID": "709",
    "_SYSTEMD_UNIT": "ss-fastexit.service",
    "__REALTIME_TIMESTAMP": AFTER,
}
"""The fields of a server's line that journald read after the server exited (as stored by
systemd 252's journald under load): no ``_SYSTEMD_INVOCATION_ID``, no cgroup, no comm."""


def _inv(main_pid: int | None = 709, since: float = STARTED) -> Invocation:
    return Invocation("ss-fastexit.service", INV, main_pid, since)


def test_a_line_stored_without_the_invocation_is_its_main_process_s() -> None:
    assert _inv().owns(UNTAGGED)
    assert _inv().select(json.dumps(UNTAGGED) + "\n") == UNTAGGED["MESSAGE"] + "\n"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"_SYSTEMD_INVOCATION_ID": "0" * 32}, "another invocation's line"),
        ({"_PID": "710"}, "another process"),
        ({"__REALTIME_TIMESTAMP": BEFORE}, "stored before the start: an earlier PID 709"),
        ({"_SYSTEMD_UNIT": "other.service"}, "another unit"),
        ({"__REALTIME_TIMESTAMP": "?"}, "no time"),
    ],
)
def test_lines_that_are_not_its_own(change: dict[str, Any], why: str) -> None:
    assert not _inv().owns({**UNTAGGED, **change}), why


def test_its_invocation_id_makes_a_line_its_own_whatever_the_pid() -> None:
    tagged = {**UNTAGGED, "_SYSTEMD_INVOCATION_ID": INV, "_PID": "12"}
    assert _inv().owns(tagged) and _inv(None).owns(tagged)
    assert _inv().owns({k: v for k, v in tagged.items() if k != "_SYSTEMD_UNIT"})


def test_without_a_main_pid_or_start_only_tagged_lines_count() -> None:
    assert not _inv(None).owns(UNTAGGED)
    assert not _inv(since=0.0).owns(UNTAGGED)
    assert _inv(None).matches() == [f"_SYSTEMD_INVOCATION_ID={INV}"]


def test_a_line_without_the_unit_field_is_its_main_process_s() -> None:
    """A stream of a non-root process carries no unit name in journald's record."""
    assert _inv().owns({k: v for k, v in UNTAGGED.items() if k != "_SYSTEMD_UNIT"})


def test_matches_ask_journalctl_for_both_and_bound_the_pid_by_time() -> None:
    assert _inv().matches() == [
        f"_SYSTEMD_INVOCATION_ID={INV}",
        "+",
        "_PID=709",
        f"--since=@{int(STARTED) - 1}",
    ]
    follow = _inv().follow_argv(["journalctl"])
    assert follow[:5] == [
        "journalctl",
        f"_SYSTEMD_INVOCATION_ID={INV}",
        "+",
        "_PID=709",
        "_SYSTEMD_UNIT=ss-fastexit.service",
    ]
    assert "-f" in follow and follow[follow.index("-o") + 1] == "cat"


def test_select_prints_messages_as_cat_does() -> None:
    tagged = {"_SYSTEMD_INVOCATION_ID": INV, "__REALTIME_TIMESTAMP": AFTER}
    rows = [
        {**tagged, "MESSAGE": "first"},
        {**tagged, "MESSAGE": [0x62, 0x61, 0xFF]},  # not UTF-8: a list of bytes
        {**tagged, "MESSAGE": "other", "_SYSTEMD_INVOCATION_ID": "1" * 32},
        {**UNTAGGED, "MESSAGE": "last"},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\nnot json\n[1]\n"
    assert _inv().select(text) == "first\nba\ufffd\nlast\n"
