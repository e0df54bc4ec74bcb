"""Does the server run what was asked: the comparisons on the engines' own payloads."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from helpers.report_data import T0, level, sweep_data, trial
from servesweep.decide.best import find_best
from servesweep.report.best_view import best_to_json, format_best
from servesweep.report.html import render_html
from servesweep.report.tables import render_markdown
from servesweep.servers.config_check import (
    Mismatch,
    compare_llama_server,
    compare_sglang,
    compare_vllm,
    non_default_args,
    same,
)

pytestmark = pytest.mark.unit

# llama-server's GET /props (llama.cpp tools/server: default_generation_settings is
# slot 0's, n_ctx the context of one slot; total_slots is --parallel)
PROPS: dict[str, Any] = {
    "default_generation_settings": {
        "id": 0,
        "id_task": -1,
        "n_ctx": 1024,
        "speculative": False,
        "is_processing": False,
        "params": {
            "n_predict": -1,
            "seed": 4294967295,
            "temperature": 0.800000011920929,
            "dynatemp_range": 0.0,
            "top_k": 40,
            "top_p": 0.949999988079071,
            "min_p": 0.05000000074505806,
            "repeat_last_n": 64,
            "repeat_penalty": 1.0,
            "samplers": ["penalties", "dry", "top_k", "top_p", "min_p", "temperature"],
        },
    },
    "total_slots": 2,
    "model_path": "/tmp/tiny.gguf",
    "modalities": {"vision": False, "audio": False},
    "chat_template": "{% for message in messages %}...",
    "build_info": "b6000-8a2afb7",
}

# vLLM's GET /v1/models
MODELS: dict[str, Any] = {
    "object": "list",
    "data": [
        {
            "id": "Qwen/Qwen2.5-0.5B-Instruct",
            "object": "model",
            "created": 1765045800,
            "owned_by": "vllm",
            "root": "Qwen/Qwen2.5-0.5B-Instruct",
            "parent": None,
            "max_model_len": 2048,
            "permission": [{"id": "modelperm-1", "object": "model_permission"}],
        }
    ],
}

# vLLM's startup line (vllm/entrypoints/utils.py log_non_default_args), with an
# argument whose value is not a Python literal
VLLM_LOG = [
    "(APIServer pid=4242) INFO 12-06 18:30:01 [api_server.py:1896] vLLM API server version 0.10.1",
    "(APIServer pid=4242) INFO 12-06 18:30:01 [utils.py:326] non-default args: {'model_tag': "
    "'Qwen/Qwen2.5-0.5B-Instruct', 'port': 8011, 'model': 'Qwen/Qwen2.5-0.5B-Instruct', "
    "'max_model_len': 2048, 'enforce_eager': True, 'max_num_seqs': 8, "
    "'gpu_memory_utilization': 0.85, 'kv_cache_dtype': 'fp8'}",
    "(APIServer pid=4242) INFO 12-06 18:30:09 [model.py:547] Resolved architecture: Qwen2",
]

# SGLang's GET /get_server_info: its ServerArgs as a dict, the scheduler's info, the
# data-parallel ranks' internal states and the version
SERVER_INFO: dict[str, Any] = {
    "model_path": "qwen/qwen2.5-0.5b-instruct",
    "tokenizer_path": "qwen/qwen2.5-0.5b-instruct",
    "context_length": None,
    "tp_size": 1,
    "dp_size": 1,
    "mem_fraction_static": 0.835,
    "max_running_requests": 128,
    "chunked_prefill_size": 4096,
    "schedule_policy": "fcfs",
    "enable_torch_compile": False,
    "cuda_graph_max_bs": 160,
    "max_total_num_tokens": 651421,
    "internal_states": [{"attention_backend": "fa3", "last_gen_throughput": 0.0}],
    "version": "0.5.0rc2",
}


def test_values_compare_as_the_command_line_gives_them() -> None:
    assert same("0.9", 0.9) and same(2048, "2048") and same("fp8", "fp8")
    assert same(True, "true") and same("on", True) and not same("off", True)
    assert not same(4096, 2048) and not same("auto", "fp8")
    assert same(0.95, 0.949999988079071)  # llama.cpp's floats are float32


def test_llama_server_props() -> None:
    # 2048 over 2 slots is 1024 each: what was asked
    assert compare_llama_server({"ctx-size": 2048, "parallel": 2}, PROPS) == []
    assert compare_llama_server({"ctx-size": 1024, "parallel": 2}, PROPS) == []  # unified
    assert compare_llama_server({"ctx-size": 0}, PROPS) == []  # the model's own
    (ctx,) = compare_llama_server({"ctx-size": 8192, "parallel": 2}, PROPS)
    assert ctx == Mismatch(
        "ctx-size", 8192, "1024 per slot x 2", "/props default_generation_settings.n_ctx"
    )
    (slots,) = compare_llama_server({"parallel": 4}, PROPS)
    assert (slots.param, slots.asked, slots.engine) == ("parallel", 4, 2)
    assert slots.source == "/props total_slots"
    one = dict(PROPS, total_slots=1)
    (cut,) = compare_llama_server({"c": 4096}, one)
    assert (cut.param, cut.asked, cut.engine) == ("c", 4096, 1024)
    # the sampling defaults it reports; what it does not report is not judged
    assert compare_llama_server({"top-k": 40, "temp": 0.8, "batch-size": 7}, PROPS) == []
    (topk,) = compare_llama_server({"top-k": 20, "flash-attn": "on"}, PROPS)
    assert topk.source == "/props default_generation_settings.params top_k"
    assert compare_llama_server({"ctx-size": 2048}, {"error": "loading"}) == []
    assert compare_llama_server({"ctx-size": 2048}, None) == []


def test_vllm_models_and_its_non_default_args_line() -> None:
    logged = non_default_args(VLLM_LOG)
    assert logged is not None and logged["max_model_len"] == 2048
    assert logged["enforce_eager"] is True and logged["kv_cache_dtype"] == "fp8"
    asked = {"max-model-len": 2048, "max-num-seqs": 8, "gpu-memory-utilization": "0.85"}
    assert compare_vllm(asked, MODELS, VLLM_LOG) == []
    found = compare_vllm({"max-model-len": 4096, "max-num-seqs": 16}, MODELS, VLLM_LOG)
    assert [(m.param, m.asked, m.engine, m.source) for m in found] == [
        ("max-model-len", 4096, 2048, "/v1/models max_model_len"),
        ("max-num-seqs", 16, 8, "log 'non-default args:' max_num_seqs"),
    ]
    # a parameter the line does not name took vLLM's default: not judged
    assert compare_vllm({"block-size": 32}, MODELS, VLLM_LOG) == []
    # a JSON configuration is completed by the engine: not judged
    spec_line = VLLM_LOG[1].replace("}", ", 'speculative_config': {'method': 'ngram', 'n': 4}}")
    asked = {"speculative-config": '{"method": "ngram"}'}
    assert compare_vllm(asked, MODELS, [spec_line]) == []
    assert non_default_args(["no such line"]) is None


def test_a_non_literal_value_in_the_args_line_keeps_the_others() -> None:
    line = (
        "INFO 12-06 18:30:01 [utils.py:326] non-default args: {'max_model_len': 1024, "
        "'compilation_config': <CompilationConfig level=3>, 'max_num_seqs': 4}"
    )
    logged = non_default_args([line])
    assert logged is not None
    assert logged["max_model_len"] == 1024 and logged["max_num_seqs"] == 4


def test_sglang_server_info() -> None:
    asked = {"tp": 1, "mem-fraction-static": 0.835, "schedule-policy": "fcfs"}
    assert compare_sglang(asked, SERVER_INFO) == []
    found = compare_sglang(
        {"max-running-requests": 256, "chunked-prefill-size": 4096, "context-length": 8192},
        SERVER_INFO,
    )
    # None is what SGLang reports for a context length it derives: a mismatch too
    assert [(m.param, m.engine) for m in found] == [
        ("max-running-requests", 128),
        ("context-length", None),
    ]
    assert found[0].source == "/get_server_info max_running_requests"


def test_a_mismatch_is_shown_by_best_the_table_and_the_report() -> None:
    trials = [trial(1, {"ctx-size": 8192}), trial(2, {"ctx-size": 2048})]
    results = {
        1: [level("chat", "c1", output_throughput=120.0)],
        2: [level("chat", "c1", output_throughput=100.0)],
    }
    data = sweep_data(trials, results)
    mismatch = {
        "trial": 1,
        "t": T0 + 150.0,
        "kind": "config_mismatch",
        "message": "...",
        "param": "ctx-size",
        "asked": 8192,
        "engine": 2048,
        "source": "/props default_generation_settings.n_ctx",
    }
    data = replace(data, mismatches=(mismatch,))
    best = find_best(data, "chat.c1.output_throughput")
    assert best.trial is not None and best.trial.id == 1
    said = (
        "config_mismatch: #1's server does not run what was asked: ctx-size asked 8192, "
        "the engine runs 2048 (/props default_generation_settings.n_ctx)"
    )
    assert any(n.startswith(said) for n in best.notes)
    assert said in format_best(best)
    out = best_to_json(best)
    assert out["best"]["config_mismatch"] == [
        {
            "param": "ctx-size",
            "asked": 8192,
            "engine": 2048,
            "source": "/props default_generation_settings.n_ctx",
        }
    ]
    assert out["ranking"][1]["config_mismatch"] == []
    assert said.replace("_", "\\_") in render_markdown(data)
    page = render_html(data)
    assert "config_mismatch: ctx-size asked 8192, the engine runs 2048" in page
    # a mismatch of an earlier attempt no longer counts
    old = replace(data, mismatches=(dict(mismatch, t=T0),))
    assert find_best(old, "chat.c1.output_throughput").mismatches == {}
