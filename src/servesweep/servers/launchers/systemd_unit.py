"""What goes into a unit's drop-in, and what a unit's settings mean for a sweep.

Pure text and data: quoting for systemd's ``ExecStart=`` and ``Environment=``
parsers, the two drop-in modes, the warnings a unit's ``Type=``, ``KillMode=`` and
``Restart=`` deserve, and the exit status from ``ExecMainCode``/``ExecMainStatus``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from servesweep.errors import LaunchError
from servesweep.servers.launchers.base import ExitStatus

__all__ = [
    "args_dropin_text",
    "dropin_text",
    "exit_status",
    "parse_int",
    "systemd_quote",
    "unit_warnings",
]

_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
# ExecMainCode is a CLD_* code of waitid(2).
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3


def systemd_quote(word: str) -> str:
    """One word of an ``ExecStart=`` line: quoted for systemd's parser, with ``%``
    specifiers and ``$`` variable expansion escaped so the word arrives verbatim."""
    text = word.replace("%", "%%").replace("$", "$$")
    if word and _SAFE_WORD.match(word):
        return text
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{text}"'


def _env_assignment(key: str, value: str) -> str:
    """``"KEY=value"`` for an ``Environment=`` line (no ``$`` expansion there)."""
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
        raise LaunchError(f"invalid environment variable name for systemd: {key!r}")
    text = f"{key}={value}".replace("%", "%%")
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _header(trial_key: str) -> str:
    return (
        f"# Written by servesweep for trial {trial_key}. The unit file itself is not changed;\n"
        "# delete this file and run `systemctl daemon-reload` to restore the unit.\n"
    )


def dropin_text(argv: Sequence[str], env: Mapping[str, str], trial_key: str) -> str:
    """The ``execstart`` drop-in: replace ExecStart with ``argv``, add ``env``."""
    lines = [_header(trial_key), "[Service]", "ExecStart="]
    lines.append("ExecStart=" + " ".join(systemd_quote(w) for w in argv))
    lines += [f"Environment={_env_assignment(k, v)}" for k, v in sorted(env.items())]
    return "\n".join(lines) + "\n"


def args_dropin_text(argv: Sequence[str], env: Mapping[str, str], trial_key: str) -> str:
    """The ``envfile`` drop-in: the unit keeps its own ``ExecStart=``, which uses
    ``$SERVESWEEP_ARGS`` (argv after the program, split by systemd at whitespace);
    ``SERVESWEEP_PROGRAM`` holds argv[0]. Set with ``Environment=`` in the drop-in
    itself, so no path has to be valid on both sides of a container or ``-H`` host."""
    bad = [w for w in argv[1:] if not w or any(c.isspace() for c in w)]
    if bad:
        raise LaunchError(
            f"systemd splits $SERVESWEEP_ARGS at whitespace, so argument {bad[0]!r} cannot "
            "be passed in envfile mode; use systemd.mode: execstart"
        )
    lines = [_header(trial_key), "[Service]"]
    lines.append(f"Environment={_env_assignment('SERVESWEEP_PROGRAM', argv[0])}")
    lines.append(f"Environment={_env_assignment('SERVESWEEP_ARGS', ' '.join(argv[1:]))}")
    lines += [f"Environment={_env_assignment(k, v)}" for k, v in sorted(env.items())]
    return "\n".join(lines) + "\n"


def unit_warnings(unit: str, props: Mapping[str, str]) -> list[str]:
    """What a unit's settings imply for a sweep, as advice (empty when all is well)."""
    out: list[str] = []
    kind = props.get("Type", "")
    if kind in ("simple", "exec", "idle"):
        out.append(
            f"{unit} is Type={kind}: systemd reports it 'active' as soon as the process "
            "starts, long before the engine can serve. servesweep's readiness gate waits "
            "for a real generation; anything that trusts `systemctl is-active` or start "
            "ordering does not (consider Type=notify)."
        )
    kill_mode = props.get("KillMode", "")
    if kill_mode and kill_mode != "control-group":
        effect = {
            "mixed": "only the main process gets SIGTERM; workers get SIGKILL without a "
            "chance to clean up",
            "process": "only the main process is signalled; workers (vLLM EngineCore, "
            "tensor-parallel workers) survive and keep GPU memory",
            "none": "no process is signalled; every process survives and keeps GPU memory",
        }.get(kill_mode, "not every process is signalled")
        out.append(
            f"{unit} has KillMode={kill_mode}: on `systemctl stop` {effect}. servesweep "
            "kills what is left in the unit's cgroup after the grace period; set "
            "KillMode=control-group to let systemd stop the whole instance."
        )
    restart = props.get("Restart", "")
    if restart and restart != "no":
        out.append(
            f"{unit} has Restart={restart}: systemd restarts a crashed trial by itself; "
            "servesweep counts the first exit as the end of the instance and stops the unit."
        )
    return out


def exit_status(props: Mapping[str, str]) -> ExitStatus:
    code = parse_int(props.get("ExecMainCode"))
    status = parse_int(props.get("ExecMainStatus"))
    if code in (_CLD_KILLED, _CLD_DUMPED):
        return ExitStatus(signal=status)
    if code == _CLD_EXITED:
        return ExitStatus(exit_code=status)
    return ExitStatus()


def parse_int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None
