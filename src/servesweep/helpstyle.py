"""The help style of the ``servesweep`` commands (click's) for the argparse parsers
that ``servesweep sim`` and ``servesweep fake-gpus`` wrap: ``Usage:``, ``Options:``
and capitalised section titles, so every command's ``--help`` reads the same."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

__all__ = ["ClickStyle", "click_style"]


class ClickStyle(argparse.RawDescriptionHelpFormatter):
    """``Usage: PROG ...`` as click writes it (argparse writes ``usage:``)."""

    def add_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[argparse._MutuallyExclusiveGroup],
        prefix: str | None = None,
    ) -> None:
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


def click_style(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` (and its subcommands) in click's help style; returns it."""
    parser.formatter_class = ClickStyle
    for group in parser._action_groups:
        if group.title:
            group.title = group.title[:1].upper() + group.title[1:]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                click_style(sub)
    return parser
