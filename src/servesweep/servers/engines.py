"""Engine presets: how params become argv, which endpoints prove readiness, which
log lines are fatal, which metrics carry speculative-decoding counters.

A preset is a plain frozen record in a dict (``PRESETS``); no plugin machinery.
Params are the server's fixed ``args`` merged with the trial's swept params
(trial wins). A param named ``env.NAME`` sets an environment variable instead of
a flag. Names are accepted with dashes or underscores.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servesweep.errors import ConfigError
from servesweep.models import FailureClass
from servesweep.spec.schema import ServerSpec

__all__ = [
    "EnginePreset",
    "FatalPattern",
    "PRESETS",
    "flag_args",
    "get_preset",
    "merged_params",
    "split_env_params",
]


@dataclass(frozen=True)
class FatalPattern:
    """A log line that means the instance will not become ready."""

    pattern: re.Pattern[str]
    failure_class: FailureClass
    reason: str

    @classmethod
    def of(cls, regex: str, failure_class: FailureClass, reason: str) -> FatalPattern:
        return cls(re.compile(regex), failure_class, reason)


ArgvBuilder = Callable[[ServerSpec, Mapping[str, Any]], list[str]]


@dataclass(frozen=True)
class EnginePreset:
    name: str
    build_argv: ArgvBuilder
    """Full argv (program included) from the server spec and the merged flag params."""
    health_path: str | None = "/health"
    """Endpoint that answers 200 when healthy (None: the engine has none)."""
    models_path: str = "/v1/models"
    metrics_path: str | None = "/metrics"
    fatal_patterns: tuple[FatalPattern, ...] = ()
    request_extras: Mapping[str, Any] = field(default_factory=dict)
    """Fields added to every generation request (e.g. ``ignore_eos`` support)."""
    supports_ignore_eos: bool = True
    spec_decode_counters: Mapping[str, str] = field(default_factory=dict)
    """Prometheus counter names: ``accepted`` (accepted draft tokens), ``drafts``
    (number of drafts), ``draft_tokens`` (drafted tokens), ``emitted``."""
    tokenize_path: str | None = None
    """Endpoint that counts prompt tokens, when the engine has one."""
    default_env: Mapping[str, str] = field(default_factory=dict)


def merged_params(spec: ServerSpec, params: Mapping[str, Any]) -> dict[str, Any]:
    """The server's fixed args overlaid with one trial's params (dash/underscore-blind)."""
    out: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for source in (spec.args, params):
        for key, value in source.items():
            norm = key.replace("_", "-")
            if norm in keys:
                del out[keys[norm]]
            keys[norm] = key
            out[key] = value
    return out


def split_env_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Separate ``env.NAME`` params (environment) from flag params."""
    flags: dict[str, Any] = {}
    env: dict[str, str] = {}
    for key, value in params.items():
        if key.startswith("env."):
            env[key[4:]] = "" if value is None else str(value)
        else:
            flags[key] = value
    return flags, env


def flag_args(
    params: Mapping[str, Any],
    *,
    bool_style: str = "flag",
    underscore: bool = False,
) -> list[str]:
    """Turn params into ``--name value`` pairs.

    ``bool_style``: ``flag`` (True -> ``--x``, False -> omitted), ``negate``
    (False -> ``--no-x``), or ``value`` (``--x true``/``--x false``).
    Lists become repeated values after one flag; dicts become JSON; None omits.
    """
    import json

    argv: list[str] = []
    for key, value in params.items():
        name = key.replace("-", "_") if underscore else key.replace("_", "-")
        flag = f"--{name}"
        if value is None:
            continue
        if isinstance(value, bool):
            if bool_style == "value":
                argv += [flag, "true" if value else "false"]
            elif value:
                argv.append(flag)
            elif bool_style == "negate":
                argv.append(f"--no-{name}")
            continue
        if isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            argv.append(flag)
            argv += [str(v) for v in value]
        else:
            argv += [flag, str(value)]
    return argv


def _program(spec: ServerSpec, default: Sequence[str]) -> list[str]:
    return list(spec.executable) if spec.executable else list(default)


def _sim_argv(spec: ServerSpec, params: Mapping[str, Any]) -> list[str]:
    import sys

    argv = _program(spec, [sys.executable, "-m", "servesweep.sim"])
    argv += ["--host", spec.host, "--port", str(spec.port)]
    if spec.model:
        argv += ["--model", spec.model]
    return argv + flag_args(params, bool_style="flag")


_COMMON_FATAL = (
    FatalPattern.of(
        r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation",
        FailureClass.START_CRASH,
        "oom",
    ),
    FatalPattern.of(
        r"[Aa]ddress already in use|EADDRINUSE", FailureClass.PORT_IN_USE, "port_in_use"
    ),
    FatalPattern.of(
        r"error: unrecognized arguments|error: argument |invalid choice:",
        FailureClass.INVALID_ARGS,
        "invalid_args",
    ),
    FatalPattern.of(
        r"^(ModuleNotFoundError|ImportError): ", FailureClass.START_CRASH, "import_error"
    ),
    FatalPattern.of(r"NCCL error|ncclInternalError|ncclSystemError", FailureClass.START_CRASH, "nccl"),
)

PRESETS: dict[str, EnginePreset] = {
    "sim": EnginePreset(
        name="sim",
        build_argv=_sim_argv,
        health_path="/health",
        fatal_patterns=(
            *_COMMON_FATAL,
            FatalPattern.of(r"^Traceback \(most recent call last\)", FailureClass.START_CRASH, "traceback"),
        ),
        spec_decode_counters={
            "accepted": "vllm:spec_decode_num_accepted_tokens_total",
            "drafts": "vllm:spec_decode_num_drafts_total",
            "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        },
        tokenize_path="/tokenize",
    ),
}


def get_preset(name: str) -> EnginePreset:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"unknown engine {name!r} (known: {known})", key="server.engine") from None
