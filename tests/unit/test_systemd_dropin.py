"""The systemd launcher's pure parts: drop-ins, quoting, warnings, exit status, cgroups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servesweep.errors import LaunchError
from servesweep.servers.launchers.base import ExitStatus
from servesweep.servers.launchers.systemd_unit import (
    args_dropin_text,
    dropin_text,
    exit_status,
    systemd_quote,
    unit_warnings,
)
from servesweep.servers.launchers.unit_cgroup import UnitCgroup


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("/usr/bin/python", "/usr/bin/python"),
        ("--max-num-seqs=8", "--max-num-seqs=8"),
        ("a b", '"a b"'),
        ("50%", '"50%%"'),
        ("$HOME", '"$$HOME"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("", '""'),
        ("{'a': 1}", "\"{'a': 1}\""),
    ],
)
def test_systemd_quote(word: str, quoted: str) -> None:
    assert systemd_quote(word) == quoted


def test_execstart_dropin_replaces_execstart_and_sets_env() -> None:
    text = dropin_text(["/bin/srv", "--x", "a b"], {"B": "2%", "A": 'q"'}, "sw-3")
    lines = text.splitlines()
    assert lines[0].startswith("# Written by servesweep for trial sw-3")
    at = lines.index("[Service]")
    assert lines[at + 1 : at + 3] == ["ExecStart=", 'ExecStart=/bin/srv --x "a b"']
    assert lines[at + 3 :] == ['Environment="A=q\\""', 'Environment="B=2%%"']


def test_envfile_mode_sets_args_and_refuses_words_with_spaces() -> None:
    text = args_dropin_text(["/bin/srv", "--x", "5%", "$Y"], {"K": "v"}, "sw-1")
    assert 'Environment="SERVESWEEP_PROGRAM=/bin/srv"' in text
    assert 'Environment="SERVESWEEP_ARGS=--x 5%% $Y"' in text
    assert 'Environment="K=v"' in text and "ExecStart" not in text
    with pytest.raises(LaunchError, match="whitespace"):
        args_dropin_text(["/bin/srv", "a b"], {}, "sw-1")


def test_bad_env_name_is_a_launch_error() -> None:
    with pytest.raises(LaunchError, match="environment variable name"):
        dropin_text(["/bin/srv"], {"BAD-NAME": "1"}, "t")


def test_warnings_for_type_killmode_restart() -> None:
    ok = {"Type": "notify", "KillMode": "control-group", "Restart": "no"}
    assert unit_warnings("u.service", ok) == []
    warned = unit_warnings(
        "u.service", {"Type": "simple", "KillMode": "process", "Restart": "always"}
    )
    assert len(warned) == 3
    assert "Type=simple" in warned[0] and "active" in warned[0]
    assert "KillMode=process" in warned[1] and "survive" in warned[1]
    assert "Restart=always" in warned[2]
    mixed = unit_warnings("u.service", {"Type": "forking", "KillMode": "mixed"})
    assert len(mixed) == 1 and "SIGKILL" in mixed[0]


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("1", "3", ExitStatus(exit_code=3)),
        ("2", "9", ExitStatus(signal=9)),
        ("3", "6", ExitStatus(signal=6)),
        ("0", "0", ExitStatus()),
        ("", "", ExitStatus()),
    ],
)
def test_exit_status_from_exec_main(code: str, status: str, expected: ExitStatus) -> None:
    assert exit_status({"ExecMainCode": code, "ExecMainStatus": status}) == expected


def _fake_cgroup(root: Path, nest: str, unit: str, pids: list[int]) -> Path:
    folder = root / nest / "system.slice" / unit
    folder.mkdir(parents=True)
    (folder / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    sub = folder / "worker"
    sub.mkdir()
    (sub / "cgroup.procs").write_text("")
    return folder


def test_cgroup_found_under_a_nested_namespace_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = os.getpid()
    # A decoy with the same relative path, holding no process of the unit.
    _fake_cgroup(tmp_path, "other/payload", "u.service", [])
    folder = _fake_cgroup(tmp_path, "sandbox/payload", "u.service", [me])
    monkeypatch.setattr(UnitCgroup, "roots", staticmethod(lambda: [tmp_path]))
    cg = UnitCgroup()
    assert cg.find("/system.slice/u.service", main_pid=me) == folder
    # The nesting is remembered: found again without the main PID.
    assert cg.find("/system.slice/u.service") == folder
    assert UnitCgroup.procs(folder) == {me}
    assert cg.find("/system.slice/none.service") is None
    assert cg.find("") is None
