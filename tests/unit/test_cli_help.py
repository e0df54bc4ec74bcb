"""Every option and argument of every command says what it is for, and the commands
that wrap another parser (``sim``, ``fake-gpus``) show ``servesweep ...`` as their name."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import click
import pytest

from servesweep.cli.main import cli, main
from servesweep.fakegpu.__main__ import build_parser as fake_gpus_parser
from servesweep.sim.config import build_parser as sim_parser


def _commands(group: click.Group, prefix: str) -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path)


def _undocumented_click() -> list[str]:
    missing: list[str] = []
    for path, command in [("servesweep", cli), *_commands(cli, "servesweep")]:
        text = " ".join((command.help or "").split())
        if not text:
            missing.append(f"{path}: the command itself")
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                missing.append(f"{path} {'/'.join(param.opts)}")
            if isinstance(param, click.Argument) and param.human_readable_name not in text:
                missing.append(f"{path} {param.human_readable_name} (not in the command's help)")
    return missing


def _undocumented_argparse(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    missing.append(f"{path} {name}")
                missing += _undocumented_argparse(sub, f"{path} {name}")
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_and_argument_has_a_description() -> None:
    missing = _undocumented_click()
    missing += _undocumented_argparse(sim_parser(), "servesweep sim")
    missing += _undocumented_argparse(fake_gpus_parser(), "servesweep fake-gpus")
    assert missing == [], "without a description:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["sim", "--help"], "Usage: servesweep sim [-h]"),
        (["fake-gpus", "--help"], "Usage: servesweep fake-gpus [-h]"),
        (["fake-gpus", "init", "--help"], "Usage: servesweep fake-gpus init [-h]"),
    ],
)
def test_wrapped_parsers_are_named_after_the_command(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith(usage) and "python -m" not in out.split("\n\n")[0]


def test_a_bad_flag_of_a_wrapped_parser_names_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["fake-gpus", "bogus"])
    assert done.value.code == 2
    assert "servesweep fake-gpus: error: " in capsys.readouterr().err


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_help_reads_the_same_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    top = _help(["--help"], capsys)
    commands = top.split("Commands:")[1].split("\n\n")[0]
    assert "..." not in commands, "a command's summary is cut"
    flat = " ".join(top.split())
    for code in ("0 every trial ok", "1 some trials failed", "2 usage", "3 internal", "130"):
        assert code in flat
    assert "stop" in top and "Stop the servers a sweep left running." in top
    run = _help(["run", "--help"], capsys)
    assert "--events FILE|-" in run and "TEXT" not in run.split("--events")[1].split("\n")[0]
    assert "Exit codes:" in run
    assert "[default: table]" in " ".join(_help(["report", "--help"], capsys).split())
    for argv in (["sim", "--help"], ["fake-gpus", "--help"], ["fake-gpus", "hold", "--help"]):
        text = _help(argv, capsys)
        assert text.startswith("Usage: servesweep ") and "\nOptions:\n" in text
        assert "usage:" not in text and "options:" not in text
