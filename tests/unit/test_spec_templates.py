"""Placeholders of the command templates are checked when the sweep file loads: a
misspelt name or a param no trial sets is a one-line error with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.errors import ConfigError
from servesweep.servers.engines import build_launch
from servesweep.spec import load_sweep, load_sweep_text

HEAD = """\
name: tpl
server:
  engine: generic
  model: /models/m
  port: 8123
  args: {tp: 2}
"""
TAIL = """\
params:
  grid: {budget: [2, 4]}
workloads:
  - {name: chat, concurrency: [1], requests: 4}
"""


def _write(tmp_path: Path, server_lines: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(HEAD + server_lines + TAIL)
    return path


def _error(tmp_path: Path, server_lines: str) -> str:
    path = _write(tmp_path, server_lines)
    with pytest.raises(ConfigError) as caught:
        load_sweep(path)
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_documented_placeholders_load_and_fill_at_launch(tmp_path: Path) -> None:
    lines = (
        '  command: "srv --model {model} --port {port} --tp {param.tp} --b {param.budget} '
        '--name {trial} --log {log} --pid {pid_file} {args}"\n'
        "  commands: {start: 'true', pid_file: '/run/srv-{trial}.pid'}\n"
    )
    loaded = load_sweep(_write(tmp_path, lines))
    argv, _ = build_launch(loaded.spec.server, {"budget": 4}, trial="tpl-3", log="/l/s.log")
    assert argv == [
        "srv", "--model", "/models/m", "--port", "8123", "--tp", "2", "--b", "4",
        "--name", "tpl-3", "--log", "/l/s.log", "--pid", "/run/srv-tpl-3.pid",
    ]  # fmt: skip


def test_a_value_with_spaces_stays_one_argument_in_a_shell_template(tmp_path: Path) -> None:
    lines = '  command: "exec srv --port {port} > {log}.out 2>&1"\n'
    loaded = load_sweep(_write(tmp_path, lines))
    argv, _ = build_launch(loaded.spec.server, {"budget": 2}, trial="t-1", log="/my logs/s.log")
    assert argv == ["/bin/sh", "-c", "exec srv --port 8123 > '/my logs/s.log'.out 2>&1"]


@pytest.mark.parametrize(
    ("server_lines", "line", "expected"),
    [
        ('  command: "srv --port {port} {param.nope}"\n', 7, "no param 'nope' is set"),
        ('  command: "srv --port {prot}"\n', 7, "unknown placeholder {prot}"),
        ('  command: "srv --port {prot}"\n', 7, "did you mean {port}?"),
        ('  command: "srv --pid {pid_file}"\n', 7, "server.commands.pid_file is not set"),
        (
            "  launcher: command\n  command: srv\n  commands: {start: 'run {argz}'}\n",
            9,
            "unknown placeholder {argz} in server.commands.start (did you mean",
        ),
        (
            "  launcher: command\n  command: srv\n"
            "  commands: {start: 'run {args}', stop: 'kill {param.tp}'}\n",
            9,
            "works only in server.commands.start and pid_file",
        ),
        (
            "  launcher: command\n  command: srv\n  commands: {start: 'run --b {param.bduget}'}\n",
            9,
            "no param 'bduget' is set",
        ),
    ],
)
def test_bad_placeholders_fail_at_load_with_file_and_line(
    tmp_path: Path, server_lines: str, line: int, expected: str
) -> None:
    text = _error(tmp_path, server_lines)
    assert text.startswith(f"{tmp_path / 'sweep.yaml'}:{line}: server.command"), text
    assert expected in text, text


def test_a_param_only_some_trials_set_names_the_trial_without_it(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        HEAD
        + '  command: "srv --w {param.window}"\n'
        + "params:\n  points: [{window: 2}, {budget: 4}]\n"
        + "workloads:\n  - {name: chat, concurrency: [1], requests: 4}\n"
    )
    with pytest.raises(ConfigError, match=r"no param 'window' is set \(trial budget=4\)"):
        load_sweep(path)


def test_shell_braces_in_the_launchers_commands_are_left_alone(tmp_path: Path) -> None:
    lines = (
        "  launcher: command\n  command: srv\n"
        "  commands: {start: \"run {args} | awk '{print $1}' ${HOME} {{x}}\", "
        "status: 'kill -0 $(cat {pid_file})', pid_file: '/run/{trial}.pid'}\n"
    )
    load_sweep(_write(tmp_path, lines))


def test_a_sampling_search_checks_its_params_too(tmp_path: Path) -> None:
    text = (
        "name: s\n"
        "server: {engine: generic, command: 'srv --s {param.seqs} --t {param.tokns}'}\n"
        "workloads:\n  - {name: chat, concurrency: [1]}\n"
        "params:\n  grid:\n    seqs: [16, 32]\n    tokens: {low: 1024, high: 8192}\n"
        "search: {strategy: tpe, trials: 4}\n"
    )
    with pytest.raises(ConfigError, match=r"sweep:2: server.command: .*\{param.tokns\}"):
        load_sweep_text(text, "sweep")
    load_sweep_text(text.replace("tokns", "tokens"), "sweep")
