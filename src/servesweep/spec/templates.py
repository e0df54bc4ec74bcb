"""Placeholders of the command templates, and their checks when a sweep file loads.

Two kinds of template take ``{name}`` placeholders: ``server.command`` (the
``generic`` engine's command line) and ``server.commands.*`` (the ``command``
launcher's shell commands). The engine and the launcher fill them when a trial
starts; here every placeholder is checked when the sweep file is loaded, so a
misspelt name or a ``{param.NAME}`` naming no param is a one-line error at ``plan``
time instead of a failed first trial.

``${VAR}`` is the shell's and is left alone, as is ``{{`` / ``}}`` (a literal brace).
In ``server.command`` every other ``{name}`` must be a placeholder. The launcher's
commands are shell code that may hold other braces (an awk program): there a
``{name}`` that is no placeholder is an error only when it looks like a misspelt one.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from servesweep.errors import ConfigError
from servesweep.spec.schema import SweepSpec

__all__ = [
    "COMMANDS_PLACEHOLDERS",
    "COMMAND_PLACEHOLDERS",
    "LAUNCH_PLACEHOLDERS",
    "PLACEHOLDER",
    "check_templates",
    "placeholders",
]

PLACEHOLDER = re.compile(r"(?<![$\{])\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_.-]+)?)\}(?!\})")
"""``{name}`` or ``{param.NAME}``, not ``${VAR}``, ``{{`` or ``}}``."""

LAUNCH_PLACEHOLDERS = ("trial", "log", "pid_file")
"""Known only when a trial starts: its key (``<sweep>-<trial id>``), its server log,
the rendered ``server.commands.pid_file``."""
COMMAND_PLACEHOLDERS = ("args", "port", "host", "model", "gpus", *LAUNCH_PLACEHOLDERS)
"""Placeholders of ``server.command``, besides ``{param.NAME}``."""
COMMANDS_PLACEHOLDERS = (
    "args",
    "argv",
    "port",
    "host",
    "model",
    "gpus",
    "tag",
    *LAUNCH_PLACEHOLDERS,
)
"""Placeholders of ``server.commands.*``, besides ``{param.NAME}``."""

_ARGV_FLAGS = ("host", "port")
"""Flags every preset's command line carries, so ``{param.host}`` always resolves."""
_PARAM_ARGV = ("start", "pid_file")
"""The launcher's commands rendered with the trial's argv (``{param.NAME}`` works)."""


def placeholders(template: str) -> Iterator[str]:
    """The placeholder names of a template, in order (``param.NAME`` included)."""
    for match in PLACEHOLDER.finditer(template):
        yield match.group(1)


def _norm(name: str) -> str:
    return name.replace("-", "_")


def _known_list(names: Sequence[str]) -> str:
    return ", ".join(f"{{{n}}}" for n in names) + ", {param.NAME}"


def _params_missing(name: str, spec: SweepSpec, configs: Sequence[Mapping[str, Any]]) -> str:
    """Why ``{param.name}`` has no value in some trial ('' when it always has one)."""
    wanted = _norm(name)
    if any(_norm(k) == wanted for k in spec.server.args):
        return ""
    for config in configs:
        if not any(_norm(k) == wanted for k in config):
            label = " ".join(f"{k}={v}" for k, v in config.items()) or "(no swept params)"
            swept = {_norm(k) for c in configs for k in c}
            where = "" if wanted in swept else " in server.args or the swept params"
            return f"no param {name!r} is set{where} (trial {label})"
    return ""


def _check_command(spec: SweepSpec, configs: Sequence[Mapping[str, Any]]) -> None:
    server = spec.server
    template = server.command
    if template is None or server.engine != "generic":
        return
    key = "server.command"
    for name in placeholders(template):
        if name.startswith("param."):
            missing = _params_missing(name[6:], spec, configs)
            if missing:
                raise ConfigError(
                    f"the command template uses {{{name}}} but {missing}; add it to "
                    "server.args or the swept params",
                    key=key,
                )
        elif name not in COMMAND_PLACEHOLDERS:
            raise ConfigError(
                f"unknown placeholder {{{name}}} in the command template"
                f"{_did_you_mean(name, COMMAND_PLACEHOLDERS)} (known: "
                f"{_known_list(COMMAND_PLACEHOLDERS)}; write ${{VAR}} for an environment "
                "variable)",
                key=key,
            )
        elif name == "model" and not server.model:
            raise ConfigError(
                "the command template uses {model} but server.model is not set", key=key
            )
        elif name == "pid_file" and not (server.commands and server.commands.pid_file):
            raise ConfigError(
                "the command template uses {pid_file} but server.commands.pid_file is not set",
                key=key,
            )


def _check_commands(spec: SweepSpec, configs: Sequence[Mapping[str, Any]]) -> None:
    commands = spec.server.commands
    if commands is None:
        return
    for field in ("start", "stop", "status", "pid_file"):
        template = getattr(commands, field)
        if template is None:
            continue
        key = f"server.commands.{field}"
        for name in placeholders(template):
            if name.startswith("param."):
                if field not in _PARAM_ARGV:
                    raise ConfigError(
                        f"{{{name}}} works only in server.commands.start and pid_file (the "
                        f"trial's command line is not known to the {field} command)",
                        key=key,
                    )
                flag = name[6:]
                missing = "" if _norm(flag) in _ARGV_FLAGS else _params_missing(flag, spec, configs)
                if missing:
                    raise ConfigError(f"{key} uses {{{name}}} but {missing}", key=key)
            elif name not in COMMANDS_PLACEHOLDERS:
                hint = _did_you_mean(name, COMMANDS_PLACEHOLDERS)
                if hint:
                    raise ConfigError(
                        f"unknown placeholder {{{name}}} in {key}{hint} (known: "
                        f"{_known_list(COMMANDS_PLACEHOLDERS)}; write {{{{ and }}}} for a "
                        "literal brace)",
                        key=key,
                    )
            elif name == "pid_file" and field == "pid_file":
                raise ConfigError("server.commands.pid_file cannot use {pid_file}", key=key)


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f" (did you mean {{{close[0]}}}?)" if close else ""


def check_templates(spec: SweepSpec, configs: Sequence[Mapping[str, Any]]) -> None:
    """Raise ``ConfigError`` (keyed ``server.command`` / ``server.commands.FIELD``) for a
    placeholder that cannot be filled in some trial; ``configs`` are the swept params
    of every trial."""
    _check_command(spec, configs)
    _check_commands(spec, configs)
