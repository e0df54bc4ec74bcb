"""The engine as installed: its program, its Python, its version, whether it imports,
and whether its own argument parser accepts the flags a preset emits.

Everything here runs the engine's programs (never servesweep's code in the engine's
environment): :mod:`servesweep.servers.engine_probe` is run by path with the
engine's interpreter. Every call is bounded by a timeout; a failure is an answer
(``None``, an ``error`` string), never an exception that reaches the caller.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesweep.servers import engine_probe

__all__ = [
    "EngineProgram",
    "ProbeAnswer",
    "locate",
    "program_version",
    "run_probe",
]

PROBE_TIMEOUT = 180.0
"""Building vLLM's or SGLang's parser imports torch: seconds, on a busy machine minutes."""
VERSION_TIMEOUT = 10.0

_SHEBANG = re.compile(rb"^#!\s*(\S+)(?:[ \t]+(\S+))?")


@dataclass(frozen=True)
class EngineProgram:
    """Where an engine's command line points on this machine."""

    program: str
    """argv[0] as written."""
    path: str | None
    """argv[0] resolved (PATH lookup); None when it does not exist here."""
    python: tuple[str, ...] | None
    """The interpreter that runs the engine: argv[0] of ``python -m MODULE``, or the
    interpreter of a console script's ``#!`` line; None for a native program."""
    module: str | None
    """The module to import: ``-m``'s argument, else the preset's."""


@dataclass(frozen=True)
class ProbeAnswer:
    data: Mapping[str, Any]
    error: str | None = None
    """The probe itself could not run or answer (timeout, no JSON)."""


def resolve(program: str) -> str | None:
    """``program`` as a path that exists and is executable, or None."""
    if os.sep in program:
        path = Path(program).expanduser()
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(program)


def _shebang_python(path: str) -> tuple[str, ...] | None:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    m = _SHEBANG.match(first)
    if m is None:
        return None
    words = [w.decode(errors="replace") for w in m.groups() if w]
    if Path(words[0]).name == "env" and len(words) > 1:
        words = words[1:]
    return tuple(words) if "python" in Path(words[0]).name else None


def locate(argv: Sequence[str], module: str | None) -> EngineProgram:
    """What runs ``argv`` here: the program, its interpreter and its module."""
    program = argv[0] if argv else ""
    path = resolve(program) if program else None
    if len(argv) >= 3 and argv[1] == "-m" and "python" in Path(program).name:
        return EngineProgram(program, path, (program,), argv[2])
    python = _shebang_python(path) if path else None
    return EngineProgram(program, path, python, module if python else None)


def run_probe(
    python: Sequence[str],
    request: Mapping[str, Any],
    timeout: float = PROBE_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> ProbeAnswer:
    """Run :mod:`engine_probe` with ``python`` (``env`` added to this environment);
    its JSON answer (the last line)."""
    script = str(Path(engine_probe.__file__).resolve())
    try:
        done = subprocess.run(
            [*python, "-I", script],
            env={**os.environ, **env} if env else None,
            input=json.dumps(dict(request)),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return ProbeAnswer({}, f"no Python at {python[0]!r}")
    except subprocess.TimeoutExpired:
        return ProbeAnswer({}, f"{python[0]} did not answer within {timeout:g}s")
    except OSError as exc:
        return ProbeAnswer({}, f"cannot run {python[0]!r}: {exc}")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return ProbeAnswer({}, f"{python[0]} could not run the probe: {tail[:300]}")
    return ProbeAnswer(data)


_VERSION_LINE = re.compile(r"version:?\s*(\S.*)", re.IGNORECASE)


def program_version(path: str, timeout: float = VERSION_TIMEOUT) -> str | None:
    """A native program's ``--version`` (first line naming a version), or None."""
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        m = _VERSION_LINE.match(line.strip())
        if m:
            return m.group(1).strip()[:120]
    return None
