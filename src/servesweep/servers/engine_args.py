"""Params to argv, the pure part: flag spelling, booleans, nested configs, templates.

Engine presets (:mod:`servesweep.servers.engines`) combine these helpers; nothing
here knows an engine. Nothing here does I/O.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from servesweep.errors import ConfigError
from servesweep.spec.schema import ServerSpec
from servesweep.spec.templates import COMMAND_PLACEHOLDERS, LAUNCH_PLACEHOLDERS, PLACEHOLDER

__all__ = [
    "BoolStyle",
    "flag_args",
    "launch_command_text",
    "merged_params",
    "nest_dotted",
    "render_template",
    "split_env_params",
]

BoolStyle = Literal["flag", "negate", "value"]


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
    """Separate ``env.NAME`` params (environment) from flag params.

    A ``None`` env value is the empty string; booleans are ``1``/``0`` (what
    ``VLLM_*``/``SGLANG_*``/``LLAMA_ARG_*`` variables expect).
    """
    flags: dict[str, Any] = {}
    env: dict[str, str] = {}
    for key, value in params.items():
        if key.startswith("env."):
            if value is None:
                env[key[4:]] = ""
            elif isinstance(value, bool):
                env[key[4:]] = "1" if value else "0"
            else:
                env[key[4:]] = str(value)
        else:
            flags[key] = value
    return flags, env


def nest_dotted(params: Mapping[str, Any], roots: Collection[str]) -> dict[str, Any]:
    """Fold dotted params under the given roots into one nested dict per root.

    ``speculative_config.method: eagle`` and ``speculative-config.num_speculative_tokens: 3``
    become ``speculative_config: {method: eagle, num_speculative_tokens: 3}``; a dict
    given for the root itself is the base that dotted params override. Roots and
    the keys below them are compared dash/underscore-blind; nested keys are written
    with underscores (the config classes' field names). Other params are untouched.
    """
    canon_roots = {r.replace("-", "_"): r for r in roots}
    out: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in params.items():
        head, dot, rest = key.partition(".")
        root = head.replace("-", "_")
        if root not in canon_roots:
            out[key] = value
            continue
        base = nested.setdefault(root, {})
        if not dot:
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"{key} must be a mapping (or set its fields as {root}.FIELD)", key=key
                )
            _deep_merge(base, {k.replace("-", "_"): v for k, v in value.items()})
            continue
        node = base
        parts = [p.replace("-", "_") for p in rest.split(".")]
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {part} is already set to a value", key=key)
            node = child
        node[parts[-1]] = value
    for root, value in nested.items():
        out[root] = value
    return out


def _deep_merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def flag_args(
    params: Mapping[str, Any],
    *,
    bool_style: BoolStyle = "flag",
    underscore: bool = False,
    negatable: Collection[str] | None = None,
) -> list[str]:
    """Turn params into ``--name value`` pairs.

    ``bool_style``: ``flag`` (True -> ``--x``, False -> omitted), ``negate``
    (False -> ``--no-x``), or ``value`` (``--x true``/``--x false``). With
    ``negate``, ``negatable`` (flag names without dashes, e.g. ``cont-batching``)
    limits ``--no-x`` to the flags that have one; other False flags are omitted.
    Lists become repeated values after one flag; dicts become compact JSON;
    None omits the flag. Names are written with dashes, or underscores when
    ``underscore``; a name given with a leading ``-`` is kept as written.
    """
    argv: list[str] = []
    for key, value in params.items():
        if key.startswith("-"):
            flag, name = key, key.lstrip("-")
        else:
            name = key.replace("-", "_") if underscore else key.replace("_", "-")
            flag = f"--{name}"
        if value is None:
            continue
        if isinstance(value, bool):
            if bool_style == "value":
                argv += [flag, "true" if value else "false"]
            elif value:
                argv.append(flag)
            elif bool_style == "negate" and (negatable is None or name in negatable):
                argv.append(f"--no-{name}")
            continue
        if isinstance(value, Mapping):
            argv += [flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        elif isinstance(value, (list, tuple)):
            argv.append(flag)
            argv += [_scalar(v) for v in value]
        else:
            argv += [flag, _scalar(value)]
    return argv


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


_PLACEHOLDER = PLACEHOLDER
_SHELL_SYNTAX = re.compile(r"[|&;<>()`$\n]|\bexec\b")
_TEMPLATE_NAMES = COMMAND_PLACEHOLDERS


def render_template(
    template: str,
    spec: ServerSpec,
    params: Mapping[str, Any],
    *,
    args: Sequence[str] | None = None,
    model: str | None = None,
    context: Mapping[str, str] | None = None,
) -> list[str]:
    """argv from a ``server.command`` template (the ``generic`` engine).

    Placeholders: ``{args}`` (every flag param not used by a ``{param.NAME}``,
    as ``--name value``), ``{port}``, ``{host}``, ``{model}``, ``{gpus}`` (comma
    list), ``{param.NAME}`` (one param's value, dash/underscore-blind), and from
    ``context`` (known when a trial starts) ``{trial}``, ``{log}``, ``{pid_file}``
    (:data:`servesweep.spec.templates.LAUNCH_PLACEHOLDERS`). Every
    substituted value is shell-quoted, so values with spaces or quotes stay one
    argument. ``${VAR}`` is left for the shell. A template with shell syntax
    (pipes, ``&&``, redirections, ``$VAR``) runs under ``/bin/sh -c``; otherwise
    it is split into argv directly and no shell is involved.
    """
    by_norm = {k.replace("-", "_"): k for k in params}
    used: set[str] = set()
    values: dict[str, str] = {}

    for match in _PLACEHOLDER.finditer(template):
        name = match.group(1)
        if name.startswith("param."):
            wanted = name[6:].replace("-", "_")
            if wanted not in by_norm:
                raise ConfigError(
                    f"the command template uses {{{name}}} but no param {name[6:]!r} is set "
                    "(add it to server.args or the swept params)",
                    key="server.command",
                )
            key = by_norm[wanted]
            used.add(key)
            values[name] = _quote_value(params[key])
        elif name not in _TEMPLATE_NAMES:
            known = ", ".join(f"{{{n}}}" for n in _TEMPLATE_NAMES)
            raise ConfigError(
                f"unknown placeholder {{{name}}} in the command template (known: {known}, "
                "{param.NAME}; write ${VAR} for an environment variable)",
                key="server.command",
            )
    model = spec.model if model is None else model
    names = _names(template)
    if "model" in names and not model:
        raise ConfigError("the command template uses {model} but server.model is not set")
    for name in LAUNCH_PLACEHOLDERS:
        if name in names:
            if not (context and context.get(name)):
                raise ConfigError(
                    f"the command template uses {{{name}}}, which has no value here "
                    "(it is known when a trial starts)",
                    key="server.command",
                )
            values[name] = shlex.quote(context[name])
    rest = {k: v for k, v in params.items() if k not in used}
    values["args"] = " ".join(
        shlex.quote(a) for a in (args if args is not None else flag_args(rest))
    )
    values["port"] = str(spec.port)
    values["host"] = shlex.quote(spec.host)
    values["model"] = shlex.quote(model or "")
    values["gpus"] = shlex.quote(",".join(str(g) for g in spec.gpus))

    text = _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)
    literal = _PLACEHOLDER.sub(" ", template)
    if _SHELL_SYNTAX.search(literal):
        return ["/bin/sh", "-c", text]
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ConfigError(
            f"the command template cannot be split: {exc}", key="server.command"
        ) from exc


def _names(template: str) -> set[str]:
    return {m.group(1) for m in _PLACEHOLDER.finditer(template)}


def _quote_value(value: Any) -> str:
    if value is None:
        return "''"
    if isinstance(value, (list, tuple)):
        return " ".join(shlex.quote(_scalar(v)) for v in value)
    return shlex.quote(_scalar(value))


def launch_command_text(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """A copy-pasteable shell line: ``env`` assignments, then the quoted argv."""
    parts = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
    parts += [shlex.quote(a) for a in argv]
    return " ".join(parts)
