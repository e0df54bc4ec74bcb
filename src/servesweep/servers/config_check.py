"""Does the server run what was asked? The trial's swept parameters against what the
engine says it runs, once it is ready.

Where an engine says it:

- vLLM: ``GET /v1/models`` (each model card's ``max_model_len``) and its startup log
  line ``non-default args: {...}`` (the parsed arguments that differ from vLLM's
  defaults, a Python dict keyed by argument ``dest``: ``max_model_len``,
  ``tensor_parallel_size``...);
- SGLang: ``GET /get_server_info`` (its ``ServerArgs`` as a dict, keyed by field:
  ``context_length``, ``tp_size``, ``mem_fraction_static``...);
- llama-server: ``GET /props`` (``default_generation_settings.n_ctx``, the context of
  one slot; ``total_slots``, its ``--parallel``; ``default_generation_settings.params``,
  the sampling defaults);
- the simulated engine answers ``/v1/models`` as vLLM does.

A parameter the engine does not report is not judged, nor a structured value (a JSON
configuration the engine completes with its defaults); a value it reports differently
is a :class:`Mismatch`: the swept name, the value asked, the engine's value and where
the engine said it. The comparisons are pure functions over the payloads
(:func:`compare_vllm`, :func:`compare_sglang`, :func:`compare_llama_server`);
:func:`check_server` fetches them through :func:`servesweep.servers.http_probe.http_call`.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servesweep.servers.http_probe import http_call

__all__ = [
    "Mismatch",
    "check_server",
    "compare_llama_server",
    "compare_sglang",
    "compare_vllm",
    "non_default_args",
]

FETCH_TIMEOUT_S = 5.0
"""How long one question to a ready server may take."""

_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")


@dataclass(frozen=True)
class Mismatch:
    """A swept parameter the server does not run as asked."""

    param: str
    """The name swept in the sweep file (``ctx-size``)."""
    asked: Any
    engine: Any
    """What the engine reports it runs."""
    source: str
    """Where it said so: ``/props default_generation_settings.n_ctx``."""

    def describe(self) -> str:
        return f"{self.param} asked {self.asked}, the engine runs {self.engine} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "asked": self.asked,
            "engine": self.engine,
            "source": self.source,
        }


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def same(asked: Any, engine: Any) -> bool:
    """Whether a value asked on the command line is the value the engine reports:
    numbers by value (``"0.9"`` is ``0.9``), booleans from their spellings, the rest
    as text."""
    if isinstance(engine, bool) or isinstance(asked, bool):
        words = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}
        flag = asked if isinstance(asked, bool) else words.get(str(asked).strip().lower())
        said = engine if isinstance(engine, bool) else words.get(str(engine).strip().lower())
        return flag is not None and flag == said
    a, e = _number(asked), _number(engine)
    if a is not None and e is not None:
        return math.isclose(a, e, rel_tol=1e-6, abs_tol=1e-9)
    return str(asked).strip() == str(engine).strip()


def _dest(param: str) -> str:
    return param.lstrip("-").replace("-", "_")


def non_default_args(lines: Iterable[str]) -> dict[str, Any] | None:
    """vLLM's ``non-default args: {...}`` from its startup log (the last such line), as
    a dict; values that are not Python literals (an object's repr) are kept as text.
    None when no line says it."""
    found: str | None = None
    for line in lines:
        match = _NON_DEFAULT.search(line)
        if match:
            found = match.group(1)
    if found is None:
        return None
    try:
        value = ast.literal_eval(found)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _loose_dict(found)
    return value if isinstance(value, dict) else None


def _loose_dict(text: str) -> dict[str, Any]:
    """``'key': value`` pairs of a dict repr that ``literal_eval`` refused (a value
    like ``<Enum.X: 1>``): the literal values parsed, the others kept as text."""
    out: dict[str, Any] = {}
    for match in re.finditer(r"'([A-Za-z_][A-Za-z0-9_]*)': ((?:[^,{}\[\]]|\[[^\]]*\])+)", text):
        raw = match.group(2).strip()
        try:
            out[match.group(1)] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            out[match.group(1)] = raw
    return out


def _compare(
    params: Mapping[str, Any],
    reported: Mapping[str, Any],
    source: str,
    key_of: Callable[[str], str | None],
) -> list[Mismatch]:
    out: list[Mismatch] = []
    for param, asked in params.items():
        key = key_of(param)
        if key is None or key not in reported or asked is None:
            continue
        if isinstance(asked, (dict, list)) or isinstance(reported[key], (dict, list)):
            continue  # a structured value (a JSON config) the engine completes: not judged
        if not same(asked, reported[key]):
            out.append(Mismatch(param, asked, reported[key], f"{source} {key}"))
    return out


def _model_len(models: Any) -> Any:
    if not isinstance(models, dict):
        return None
    data = models.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    return data[0].get("max_model_len")


def compare_vllm(
    params: Mapping[str, Any], models: Any, log_lines: Iterable[str] = ()
) -> list[Mismatch]:
    """vLLM (and the simulated engine): ``max-model-len`` against ``/v1/models``; every
    swept parameter that the ``non-default args`` line names against its value there."""
    out: list[Mismatch] = []
    model_len = _model_len(models)
    if model_len is not None:
        out += _compare(
            params,
            {"max_model_len": model_len},
            "/v1/models",
            lambda p: "max_model_len" if _dest(p) == "max_model_len" else None,
        )
    logged = non_default_args(log_lines)
    if logged:
        seen = {m.param for m in out}
        rest = {p: v for p, v in params.items() if p not in seen}
        out += _compare(rest, logged, "log 'non-default args:'", _dest)
    return out


_SGLANG_ALIASES = {"tp": "tp_size", "dp": "dp_size", "pp": "pp_size", "ep": "ep_size"}


def compare_sglang(params: Mapping[str, Any], server_info: Any) -> list[Mismatch]:
    """SGLang: every swept parameter whose ``ServerArgs`` field ``/get_server_info``
    reports (``--tp`` is ``tp_size``)."""
    if not isinstance(server_info, dict):
        return []
    return _compare(
        params,
        server_info,
        "/get_server_info",
        lambda p: _SGLANG_ALIASES.get(_dest(p), _dest(p)),
    )


_LLAMA_SAMPLING = {
    "temp": "temperature",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "n_predict": "n_predict",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
}


def compare_llama_server(params: Mapping[str, Any], props: Any) -> list[Mismatch]:
    """llama-server: ``ctx-size`` (``-c``; 0, the model's own, is not judged) against
    the context it gave its slots (``n_ctx`` per slot, the asked size split over
    ``total_slots`` or not), ``parallel`` (``-np``) against ``total_slots``, and the
    sampling defaults it reports."""
    if not isinstance(props, dict):
        return []
    out: list[Mismatch] = []
    settings = props.get("default_generation_settings")
    settings = settings if isinstance(settings, dict) else {}
    slots = props.get("total_slots")
    for param, asked in params.items():
        dest = _dest(param)
        if dest in ("ctx_size", "c") and "n_ctx" in settings and _number(asked) != 0:
            # 0 asks for the model's own context: whatever it reports is that
            n_ctx = settings["n_ctx"]
            per_slot = _number(n_ctx)
            whole = None if per_slot is None or not isinstance(slots, int) else per_slot * slots
            if not (same(asked, n_ctx) or (whole is not None and same(asked, whole))):
                engine = n_ctx if whole is None or slots == 1 else f"{n_ctx} per slot x {slots}"
                source = "/props default_generation_settings.n_ctx"
                out.append(Mismatch(param, asked, engine, source))
        elif dest in ("parallel", "np") and slots is not None and not same(asked, slots):
            out.append(Mismatch(param, asked, slots, "/props total_slots"))
    sampling = settings.get("params")
    if isinstance(sampling, dict):
        out += _compare(
            params,
            sampling,
            "/props default_generation_settings.params",
            lambda p: _LLAMA_SAMPLING.get(_dest(p)),
        )
    return out


_ASKS: dict[str, str] = {
    "vllm": "/v1/models",
    "sim": "/v1/models",
    "sglang": "/get_server_info",
    "llama-server": "/props",
}


def check_server(
    engine: str,
    host: str,
    port: int,
    params: Mapping[str, Any],
    *,
    api_key: str | None = None,
    log_lines: Iterable[str] = (),
) -> list[Mismatch]:
    """Ask a ready server of ``engine`` what it runs and compare with ``params``.
    Engines that say nothing, and answers that cannot be read, give no mismatch: this
    check warns, it never fails a trial."""
    path = _ASKS.get(engine)
    if path is None or not params:
        return []
    answer = http_call(host, port, "GET", path, api_key=api_key, timeout=FETCH_TIMEOUT_S)
    payload = None if isinstance(answer, str) or answer.status != 200 else answer.json()
    if engine == "sglang":
        return compare_sglang(params, payload)
    if engine == "llama-server":
        return compare_llama_server(params, payload)
    return compare_vllm(params, payload, log_lines)
