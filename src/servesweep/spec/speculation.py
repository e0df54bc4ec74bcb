"""Speculative-decoding settings that silently do nothing, by engine.

Some engines accept a draft model (or a draft knob) and then do not speculate: the
server starts, serves and is measured, and the sweep compares configurations that
are all the same no-speculation server, with no acceptance anywhere to show it.
:func:`silent_speculation` names such a configuration with the fix in one line; the
sweep file's checks (:mod:`servesweep.spec.check`, before any launch: ``run``,
``plan``, ``doctor``) and every launch (``servers.engines.build_launch``, so also
``apply --set``) refuse it.

What each engine does (checked in its sources; docs/engines.md names them):

- ``llama-server`` (llama.cpp ``common/arg.cpp``, ``common/speculative.cpp``):
  ``--spec-type`` defaults to ``none``; ``-md``/``--model-draft``/``--spec-draft-model``
  (or ``-hfd``) alone loads the draft and drafts nothing (it infers a type only from a
  DFlash or MTP draft's own metadata). A draft needs a ``draft-*`` type
  (``draft-simple`` for a plain smaller model); an explicit ``spec-type: none`` is
  taken as meant (the draft loaded, nothing drafted: to measure its memory). The
  ``--spec-draft-*`` knobs act only with a ``draft-*`` type, ``--spec-ngram-KIND-*``
  only with ``ngram-KIND`` (``ngram-mod`` also from ``--spec-default``).
- ``sglang`` (``server_args.py`` / ``arg_groups``): ``--speculative-algorithm``
  defaults to none, and every other ``--speculative-*`` flag, the draft model path
  included, is then ignored.
- ``llamacpp`` (llama-cpp-python ``llama_cpp/server/model.py``): ``draft_model`` of
  any value turns on prompt-lookup decoding (it loads no model: a path given there is
  not used as a draft); ``draft_model_num_pred_tokens`` acts only with it.
- ``vllm``: no such case: ``speculative_config.model`` without ``method`` is
  speculated with (the method is inferred, ``draft_model`` by default), and
  ``num_speculative_tokens`` without a model or a draft-free method is refused at start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["silent_speculation"]

_LLAMA_DRAFT = ("model-draft", "md", "spec-draft-model", "spec-draft-hf", "hfd", "hfrd")
_LLAMA_DRAFT_ENV = "LLAMA_ARG_SPEC_DRAFT_MODEL"
_LLAMA_TYPE_ENV = "LLAMA_ARG_SPEC_TYPE"
_LLAMA_DRAFT_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
_LLAMA_DRAFT_KNOBS = (
    *("spec-draft-n-max", "spec-draft-n-min", "spec-draft-p-min", "spec-draft-p-split"),
    *("draft-p-min", "draft-p-split"),
)
_LLAMA_NGRAM_KINDS = ("ngram-simple", "ngram-map-k4v", "ngram-map-k", "ngram-mod")
_SGLANG_DRAFT = ("speculative-draft-model-path", "speculative-draft-model")
_PROMPT_LOOKUP = "prompt-lookup-decoding"


def _norm(key: str) -> str:
    if key.startswith("env."):
        return key
    return key.lstrip("-").lower().replace("_", "-")


def _is_set(value: Any) -> bool:
    return value is not None and value is not False and value != ""


def _values(value: Any) -> list[str]:
    """The names in a comma list or a YAML list (``spec-type: draft-simple,ngram-mod``)."""
    items: Iterable[Any] = value if isinstance(value, (list, tuple)) else [value]
    return [n.strip().lower() for item in items for n in str(item).split(",") if n.strip()]


class _Params:
    """A configuration's params, dash/underscore- and case-blind, with its environment."""

    def __init__(self, params: Mapping[str, Any], env: Mapping[str, str]) -> None:
        self.flags = {_norm(k): v for k, v in params.items() if _is_set(v)}
        self.env = {k: v for k, v in env.items() if v}
        self.env.update({k[4:]: str(v) for k, v in params.items() if k.startswith("env.")})

    def first(self, names: Iterable[str]) -> str | None:
        return next((n for n in names if n in self.flags), None)

    def show(self, name: str) -> str:
        return f"{name}={self.flags[name]}"


def _llama_types(p: _Params) -> tuple[str | None, set[str]]:
    """Where the speculation types come from and which they are."""
    if "spec-type" in p.flags:
        return "spec-type", set(_values(p.flags["spec-type"]))
    if _LLAMA_TYPE_ENV in p.env:
        return f"env.{_LLAMA_TYPE_ENV}", set(_values(p.env[_LLAMA_TYPE_ENV]))
    return None, set()


def _llama_server(p: _Params) -> str | None:
    where, types = _llama_types(p)
    if p.flags.get("spec-default") is True:
        types.add("ngram-mod")
    drafting = sorted(types & set(_LLAMA_DRAFT_TYPES))
    kinds = ", ".join(_LLAMA_DRAFT_TYPES[1:])
    draft = p.first(_LLAMA_DRAFT)
    shown = p.show(draft) if draft else None
    if draft is None and _LLAMA_DRAFT_ENV in p.env:
        draft, shown = f"env.{_LLAMA_DRAFT_ENV}", f"env.{_LLAMA_DRAFT_ENV}"
    if draft is not None and not drafting and types != {"none"}:
        # an explicit ``spec-type: none`` is deliberate (the draft's memory, no drafting)
        found = f"{where}={','.join(sorted(types))}" if where else "no spec-type"
        return (
            f"llama-server: a draft model ({shown}) with {found} loads the draft and drafts "
            f"nothing (llama.cpp's --spec-type defaults to none): add spec-type: draft-simple "
            f"(or the draft's kind: {kinds}; spec-type: none if that is meant)"
        )
    knob = p.first(_LLAMA_DRAFT_KNOBS)
    if knob is not None and not drafting:
        return (
            f"llama-server: {p.show(knob)} acts only with a draft spec-type, and this "
            f"configuration has {where or 'no spec-type'}: nothing is drafted, so it changes "
            "nothing; add model-draft with spec-type: draft-simple, or drop it here"
        )
    for name in p.flags:
        kind = next((k for k in _LLAMA_NGRAM_KINDS if name.startswith(f"spec-{k}-")), None)
        if kind is not None and kind not in types:
            return (
                f"llama-server: {p.show(name)} acts only with spec-type {kind}, which this "
                f"configuration does not set: it changes nothing; add {kind} to spec-type, "
                "or drop it here"
            )
    return None


def _sglang(p: _Params) -> str | None:
    if "speculative-algorithm" in p.flags:
        return None
    draft = p.first(_SGLANG_DRAFT)
    if draft is not None:
        return (
            f"sglang: a draft model ({p.show(draft)}) without speculative-algorithm is not "
            "used (SGLang's algorithm defaults to none: no speculation); add "
            "speculative-algorithm: STANDALONE for a smaller LLM (EAGLE or EAGLE3 for an "
            "EAGLE head, DFLASH for a DFlash draft)"
        )
    knob = next((k for k in p.flags if k.startswith("speculative-")), None)
    if knob is not None:
        return (
            f"sglang: {p.show(knob)} without speculative-algorithm changes nothing (SGLang's "
            "algorithm defaults to none: no speculation); add speculative-algorithm, or drop it"
        )
    return None


def _llamacpp(p: _Params) -> str | None:
    method = p.flags.get("draft-model")
    if method is not None and str(method) != _PROMPT_LOOKUP:
        return (
            f"llamacpp: draft_model={method} is not loaded as a draft: llama-cpp-python's "
            f"server knows only draft_model: {_PROMPT_LOOKUP} (any value runs prompt lookup); "
            "give that, or serve a draft model with engine: llama-server (model-draft, "
            "spec-type: draft-simple)"
        )
    if method is None and "draft-model-num-pred-tokens" in p.flags:
        return (
            f"llamacpp: {p.show('draft-model-num-pred-tokens')} without draft_model changes "
            f"nothing (no speculation); add draft_model: {_PROMPT_LOOKUP}, or drop it"
        )
    return None


_RULES: dict[str, Callable[[_Params], str | None]] = {
    "llama-server": _llama_server,
    "sglang": _sglang,
    "llamacpp": _llamacpp,
}


def silent_speculation(
    engine: str, params: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> str | None:
    """Why ``params`` (a configuration's flags, ``env.NAME`` params included; ``env``:
    the server's environment) would set up speculative decoding that does not run on
    ``engine``, with the fix, in one line; None when it does not."""
    rule = _RULES.get(engine)
    return rule(_Params(params, env or {})) if rule else None
