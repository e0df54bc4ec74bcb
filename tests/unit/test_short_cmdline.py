"""A long command line is shortened in the middle: the program and its script stay."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from servesweep.errors import TrialFailed
from servesweep.models import GpuHolder, GpuState, ProcessInfo, short_cmdline
from servesweep.servers.release import ReleasePolicy, wait_released

HOLDER = (
    "/home/runner/work/servesweep/servesweep/.venv/bin/python3 "
    "/home/runner/work/servesweep/servesweep/tests/gpu/server/holder.py "
    "--devices 0 --gib 56 --log /tmp/pytest-of-runner/pytest-3/foreign_before0/holder.log"
)


def test_a_short_command_line_is_unchanged() -> None:
    assert short_cmdline("python3 -m http.server 8000") == "python3 -m http.server 8000"


def test_the_program_and_the_script_survive_and_the_middle_goes() -> None:
    short = short_cmdline(HOLDER, 100)
    assert len(short) <= 100
    # the old cut ([:80], then [:120]) ended inside the script's path
    assert "holder.py" not in HOLDER[:80]
    assert short.startswith(HOLDER.split()[0] + " ") or short.startswith(".../bin/python3 ")
    assert "server/holder.py" in short
    assert " ... " in short
    assert short.endswith("holder.log")


def test_a_module_is_kept_with_its_interpreter() -> None:
    line = "/opt/venv/bin/python -m vllm.entrypoints.openai.api_server " + "--flag x " * 30
    short = short_cmdline(line, 100)
    assert short.startswith("/opt/venv/bin/python -m vllm.entrypoints.openai.api_server ... ")
    assert len(short) <= 100
    assert short.endswith("--flag x")


def test_a_plain_program_keeps_its_name_and_the_end() -> None:
    line = "/usr/local/bin/llama-server " + " ".join(f"--opt{i} {i}" for i in range(40))
    short = short_cmdline(line, 80)
    assert short.startswith("/usr/local/bin/llama-server ... ")
    assert short.endswith("--opt39 39") and len(short) <= 80


def test_a_head_longer_than_the_limit_keeps_the_last_parts_of_its_paths() -> None:
    deep = "/a" * 60 + "/bin/python3"
    script = "/b" * 60 + "/server/holder.py"
    short = short_cmdline(f"{deep} {script} --gib 3", 60)
    assert short == ".../bin/python3 .../server/holder.py ... --gib 3"


class _OneState:
    """A GPU probe that always shows one holder."""

    name = "scripted"

    def __init__(self, holder: GpuHolder) -> None:
        self.holder = holder

    def snapshot(self, gpus: Sequence[int] | None = None) -> list[GpuState]:
        return [GpuState(0, "g", 80 * 2**30, 40 * 2**30, (self.holder,))]

    def describe(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass


def test_gpu_busy_and_process_descriptions_name_the_script() -> None:
    dead = 2**22 + 7  # above pid_max's default: not a live process
    probe = _OneState(GpuHolder(dead, 40 * 2**30, "python3", HOLDER))
    with pytest.raises(TrialFailed) as caught:
        wait_released(
            probe,
            [0],
            {0: 0},
            ReleasePolicy(2**30, 0.0, 0.05, "wait"),
            old_pids={dead},
        )
    assert "server/holder.py" in caught.value.evidence.message
    assert "server/holder.py" in ProcessInfo(pid=7, state="S", cmdline=HOLDER).describe()
