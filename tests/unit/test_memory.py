"""Memory prediction: the model files read (GGUF header, config.json, safetensors
headers), each engine's rules, and what `plan` and `doctor` say with them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import gguf
import pytest

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from servesweep.cli.main import main
from servesweep.servers.memory import Capacity, MemoryModel, read_model_facts
from servesweep.servers.memory.gguf import read_gguf
from servesweep.servers.memory.prediction import MemoryPrediction
from servesweep.spec.load import load_sweep_text

GiB = 2**30
MiB = 2**20

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8"},
}


def _sweep(server: dict[str, Any], grid: dict[str, list[Any]] | None = None) -> str:
    return json.dumps(
        {
            "name": "mem",
            "server": server,
            "params": {"grid": grid or {}},
            "workloads": [{"name": "chat"}],
        }
    )


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A safetensors file with zeroed data; returns the data bytes."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return offset


def test_gguf_header_matches_the_gguf_package(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    ours = read_gguf(path)
    theirs = gguf.GGUFReader(str(path))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    assert [t.nbytes for t in ours.tensors] == [int(t.n_bytes) for t in theirs.tensors]
    facts = read_model_facts(str(path))
    shape = TinyLlamaShape()
    assert (facts.n_layers, facts.n_kv_heads, facts.head_dim_k) == (2, 2, 16)
    assert facts.hidden == shape.n_embd and facts.n_ctx_train == shape.context_length
    assert facts.vocab == len(theirs.fields["tokenizer.ggml.tokens"].data)
    data = sum(int(t.n_bytes) for t in theirs.tensors)
    assert data <= facts.weights_bytes <= data + 32 * len(theirs.tensors)


def test_not_a_gguf_file_is_unreadable(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    model = MemoryModel(
        load_sweep_text(_sweep({"engine": "llama-server", "model": str(bad)})).spec.server,
        Capacity(64 * GiB, "host", "test"),
    )
    predicted = model.predict({})
    assert predicted.verdict == "unknown"
    assert "not a GGUF file" in predicted.reason


def test_safetensors_headers_give_exact_weights_and_experts(tmp_path: Path) -> None:
    cfg = {**LLAMA_8B, "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    dense = _write_safetensors(
        tmp_path / "model-00001.safetensors",
        {"model.embed_tokens.weight": ("BF16", [1000, 64]), "lm_head.weight": ("BF16", [1000, 64])},
    )
    experts = _write_safetensors(
        tmp_path / "model-00002.safetensors",
        {f"model.layers.0.mlp.experts.{e}.up_proj.weight": ("BF16", [128, 64]) for e in range(4)},
    )
    facts = read_model_facts(str(tmp_path))
    assert facts.weights_how == "safetensors headers"
    assert facts.weights_bytes == dense + experts
    assert facts.expert_bytes == experts


def _vllm(tmp_path: Path, cfg: dict[str, Any], args: dict[str, Any], gib: int = 80) -> MemoryModel:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_sweep_text(
        _sweep(
            {
                "engine": "vllm",
                "model": "org/elsewhere",
                "model_config": "config.json",
                "args": args,
            }
        ),
        name=str(tmp_path / "sweep.yaml"),
    ).spec
    return MemoryModel.of_sweep(spec, Capacity(gib * GiB, "gpu", "test"))


def test_vllm_llama_8b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = _vllm(tmp_path, LLAMA_8B, {"max-model-len": 8192})
    fits = model.predict({})
    # 8.03 B parameters in bf16, counted from the config (vLLM: "took 14.96 GiB")
    assert abs(fits.weights - 16_060_522_496) < 0.001 * fits.weights
    assert fits.verdict == "fits" and fits.capacity == int(0.9 * 80 * GiB)
    assert fits.per_gpu_bytes == fits.capacity  # vLLM fills its share with KV cache
    per_token = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head x (K, V) x bf16
    assert fits.kv_tokens == fits.kv_cache // per_token
    tp2 = model.predict({"tensor-parallel-size": 2})
    assert abs(tp2.weights - fits.weights / 2) < MiB
    assert tp2.kv_tokens > 2 * fits.kv_tokens  # half the heads, more room
    # the whole context of one request no longer fits in 0.3 of the GPU
    tight = model.predict({"gpu-memory-utilization": 0.3, "max-model-len": 131072})
    assert tight.verdict == "oom" and tight.certain_oom
    assert "max-model-len 131072" in tight.reason


def test_vllm_room_is_what_is_left_beyond_the_kv_cache_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM gives its KV cache all that is left of its share, so a fit fills the
    capacity exactly; the room is what is left beyond one request of max-model-len,
    and ``over_by`` says it (negative)."""
    monkeypatch.chdir(tmp_path)
    model = _vllm(tmp_path, LLAMA_8B, {"max-model-len": 8192})
    per_token = 32 * 8 * 128 * 2 * 2
    fits = model.predict({})
    assert fits.per_gpu_bytes == fits.capacity and fits.kv_needed == 8192 * per_token
    assert fits.over_by == 8192 * per_token - fits.kv_cache < 0
    # the KV cache for one request barely fits: within the margin, on the safe side
    room = fits.kv_cache // per_token
    edge = model.predict({"max-model-len": room - 100})
    assert edge.verdict == "fits" and -fits.margin < edge.over_by < 0
    # past it: over_by is what the engine would miss, as before
    tight = model.predict({"gpu-memory-utilization": 0.3, "max-model-len": 131072})
    assert tight.verdict == "oom" and tight.over_by == tight.per_gpu_bytes - tight.capacity > 0
    # a KV cache given in bytes is sized by the setting, not what is left
    given = model.predict({"kv-cache-memory-bytes": 4 * GiB})
    assert given.kv_needed == 0 and given.over_by == given.per_gpu_bytes - given.capacity
    assert MemoryPrediction.from_json(fits.to_json()).over_by == fits.over_by


def test_vllm_mla_cache_and_expert_parallel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model = _vllm(tmp_path, DEEPSEEK_V3, {"max-model-len": 4096}, gib=141)
    facts = read_model_facts("x", str(tmp_path / "config.json"))
    assert facts.mla and facts.kv_elements_per_token() == 61 * (512 + 64)
    # 671 B parameters, FP8: about 670 GB, of which ~650 GB routed experts
    assert 600e9 < facts.weights_bytes < 720e9
    assert facts.expert_bytes > 0.9 * facts.weights_bytes
    tp8 = model.predict({"tensor-parallel-size": 8})
    assert tp8.verdict == "fits"  # 8 x H200 hold it; 8 x 80 GiB would not
    assert _vllm(tmp_path, DEEPSEEK_V3, {}, gib=80).predict({"tp": 8}).verdict == "oom"
    one = model.predict({})
    assert one.verdict == "oom" and one.certain_oom
    ep = model.predict(
        {"tensor-parallel-size": 8, "data-parallel-size": 2, "enable-expert-parallel": True}
    )
    assert ep.weights < tp8.weights


def test_sglang_mem_fraction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    spec = load_sweep_text(
        _sweep({"engine": "sglang", "model": "x", "model_config": "config.json"})
    ).spec
    model = MemoryModel.of_sweep(spec, Capacity(24 * GiB, "gpu", "test"))
    ok = model.predict({"mem-fraction-static": 0.9, "cuda-graph-max-bs": 8})
    assert ok.verdict == "fits" and ok.kv_tokens > 0
    no_pool = model.predict({"mem-fraction-static": 0.5})
    assert no_pool.verdict == "oom" and "no room for the KV pool" in no_pool.reason
    # EAGLE-style verify work grows with the draft tokens and the graph batch
    small = model.predict({"speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": 4})
    big = model.predict({"speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": 64})
    assert big.workspace > small.workspace


def test_llama_server_kv_follows_ctx_size_and_cache_type(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    spec = load_sweep_text(_sweep({"engine": "llama-server", "model": str(path)})).spec
    model = MemoryModel.of_sweep(spec, Capacity(64 * GiB, "host", "test"))
    f16 = model.predict({"ctx-size": 8192})
    assert f16.device == "host"
    assert f16.kv_cache == 2 * 2 * 16 * 2 * 2 * 8192  # layers x heads x dim x (K,V) x f16
    q8 = model.predict({"ctx-size": 8192, "cache-type-k": "q8_0", "cache-type-v": "q8_0"})
    assert q8.kv_cache == 2 * 2 * (32 // 32 * 34) * 8192
    assert model.predict({"ctx-size": 16384}).kv_cache == 2 * f16.kv_cache


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    assert isinstance(exit_info.value.code, int)
    return exit_info.value.code, out, err


SIM = """
name: simmem
server:
  engine: sim
  gpus: [0]
  gpu_backend: fake
  fake_gpu_dir: gpus
  fake_gpus: {count: 1, memory: 80GiB}
params:
  grid:
    mem-per-gpu: [40GiB, 79GiB, 100GiB]
workloads: [{name: chat}]
"""


def test_plan_json_and_doctor_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sim.yaml"
    sweep.write_text(SIM)
    code, out, _ = _run(capsys, "plan", str(sweep), "--json")
    assert code == 0
    trials = json.loads(out)["trials"]
    verdicts = [t["predicted_memory"]["verdict"] for t in trials]
    assert verdicts == ["fits", "fits", "oom"]
    first = trials[0]
    assert first["id"] == 1 and first["params"] == {"mem-per-gpu": "40GiB"}
    memory = first["predicted_memory"]
    keys = {"per_gpu_bytes", "weights", "kv_cache", "draft", "workspace", "margin", "capacity"}
    assert keys <= set(memory)
    assert memory["per_gpu_bytes"] == 40 * GiB and memory["capacity"] == 80 * GiB
    assert memory["margin"] == 0 and memory["kv_cache"] == 0
    code, out, _ = _run(capsys, "plan", str(sweep))
    assert code == 0
    assert "capacity 80.0G from server.fake_gpus" in out
    assert "2 fit, 1 predicted not to fit, 0 unknown" in out
    code, out, err = _run(capsys, "doctor", str(sweep))
    assert "warning: mem-per-gpu=100GiB is predicted not to fit" in err


VLLM_LOG = [
    "INFO 05-07 10:12:33 [gpu_model_runner.py:1329] Model loading took 14.9889 GiB and "
    "4.390270 seconds",
    "INFO 05-07 10:12:44 [gpu_worker.py:222] Available KV cache memory: 54.59 GiB",
    "INFO 05-07 10:12:44 [kv_cache_utils.py:634] GPU KV cache size: 447,232 tokens",
    "INFO 05-07 10:13:05 [gpu_model_runner.py:1686] Graph capturing finished in 21 secs, "
    "took 0.53 GiB",
]
SGLANG_LOG = [
    "[2025-05-07 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
    "avail mem=64.18 GB, mem usage=15.06 GB.",
    "[2025-05-07 10:00:01 TP0] KV Cache is allocated. #tokens: 413563, K size: 25.24 GB, "
    "V size: 25.24 GB",
    "[2025-05-07 10:00:10 TP0] Capture cuda graph end. Time elapsed: 8.91 s. mem usage=0.41 GB. "
    "avail mem=8.41 GB.",
]


def test_engine_memory_figures_from_their_logs() -> None:
    from servesweep.servers.memory.calibrate import parse_memory_log

    vllm = parse_memory_log("vllm", VLLM_LOG)
    assert vllm is not None
    assert vllm.weights == int(14.9889 * GiB) and vllm.kv_cache == int(54.59 * GiB)
    assert vllm.kv_tokens == 447232 and vllm.workspace == int(0.53 * GiB)
    sglang = parse_memory_log("sglang", SGLANG_LOG)
    assert sglang is not None
    assert sglang.weights == int(15.06 * GiB) and sglang.kv_tokens == 413563
    assert sglang.kv_cache == 2 * int(25.24 * GiB)
    assert parse_memory_log("vllm", ["INFO nothing about memory"]) is None
    assert parse_memory_log("generic", VLLM_LOG) is None


def test_a_measured_trial_corrects_the_rest_of_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servesweep.servers.memory.calibrate import Calibrator, parse_memory_log

    monkeypatch.chdir(tmp_path)
    model = _vllm(tmp_path, LLAMA_8B, {"max-model-len": 8192})
    first = model.predict({})
    measured = parse_memory_log("vllm", VLLM_LOG)
    assert measured is not None
    calibrator = Calibrator("vllm")
    model.learn(calibrator.add(first, measured, model.calibration))
    after = model.predict({})
    assert after.calibrated == 1
    assert abs(after.weights - measured.weights) < MiB
    per_token = measured.kv_cache / measured.kv_tokens
    assert abs(after.kv_cache / after.kv_tokens - per_token) < 0.01 * per_token


def _llama_gpu(tmp_path: Path) -> MemoryModel:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    server = {"engine": "llama-server", "model": str(path), "gpus": [0], "gpu_backend": "nvml"}
    spec = load_sweep_text(_sweep(server)).spec
    return MemoryModel.of_sweep(spec, Capacity(140 * GiB, "gpu", "NVML"))


def _cuda_log(weights: int, kv: int, compute: int) -> list[str]:
    return [
        "llama_model_loader: loaded meta data with 30 key-value pairs",
        f"load_tensors:        CUDA0 model buffer size = {weights / MiB:10.2f} MiB",
        "load_tensors:   CPU_Mapped model buffer size =     9.89 MiB",
        "llama_context:  CUDA_Host  output buffer size =     0.04 MiB",
        f"llama_kv_cache:      CUDA0 KV buffer size = {kv / MiB:10.2f} MiB",
        f"sched_reserve:      CUDA0 compute buffer size = {compute / MiB:10.2f} MiB",
        "sched_reserve:  CUDA_Host compute buffer size =    36.01 MiB",
    ]


def test_a_gpu_trial_calibrates_what_no_buffer_report_shows(tmp_path: Path) -> None:
    """llama.cpp's report leaves out the CUDA context, cuBLAS and the memory pool: one
    trial's NVML figure less its report is the overhead every later prediction adds."""
    from dataclasses import replace

    from servesweep.servers.memory.calibrate import Calibrator, parse_memory_log
    from servesweep.servers.memory.rules import CUDA_CONTEXT

    model = _llama_gpu(tmp_path)
    first = model.predict({"ctx-size": 4096})
    assert first.device == "gpu"
    compute = first.workspace - CUDA_CONTEXT  # the workspace rule is right here
    reported = parse_memory_log("llama-server", _cuda_log(first.weights, first.kv_cache, compute))
    assert reported is not None and reported.device == "CUDA0"
    assert reported.overhead is None  # no device figure: nothing to learn beside the report
    nvml = reported.reported + 698 * MiB
    measured = replace(reported, device_used=nvml)
    assert measured.overhead == nvml - reported.reported
    model.learn(Calibrator("llama-server").add(first, measured, model.calibration))
    assert model.calibration.overhead == measured.overhead
    again = model.predict({"ctx-size": 4096})
    assert abs(again.per_gpu_bytes - nvml) < MiB
    other = model.predict({"ctx-size": 65536, "parallel": 4})
    raw = MemoryModel(model.server, model.capacity).predict({"ctx-size": 65536, "parallel": 4})
    assert other.kv_cache == raw.kv_cache
    expected = raw.per_gpu_bytes - CUDA_CONTEXT + measured.overhead
    assert abs(other.per_gpu_bytes - expected) < 0.01 * expected


def test_a_host_trial_learns_no_device_overhead(tmp_path: Path) -> None:
    from dataclasses import replace

    from servesweep.servers.memory.calibrate import Calibrator, parse_memory_log

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    spec = load_sweep_text(_sweep({"engine": "llama-server", "model": str(path)})).spec
    model = MemoryModel.of_sweep(spec, Capacity(64 * GiB, "host", "test"))
    first = model.predict({})
    log = [
        f"load_tensors:   CPU_Mapped model buffer size = {first.weights / MiB:.2f} MiB",
        f"llama_kv_cache:        CPU KV buffer size = {first.kv_cache / MiB:.2f} MiB",
    ]
    reported = parse_memory_log("llama-server", log)
    assert reported is not None and reported.device == "CPU"
    measured = replace(reported, device_used=8 * GiB)
    assert measured.overhead is None
    model.learn(Calibrator("llama-server").add(first, measured, model.calibration))
    assert model.calibration.overhead == 0


def test_cuda_flash_attention_over_a_quantized_cache_holds_f16_copies(tmp_path: Path) -> None:
    model = _llama_gpu(tmp_path)
    q8 = {"cache-type-k": "q8_0", "cache-type-v": "q8_0"}
    f16 = model.predict({"ctx-size": 32768})
    quantized = model.predict({"ctx-size": 32768, **q8})
    # tiny.gguf: 2 KV heads of 16 dims for K and V, f16
    assert quantized.workspace - f16.workspace == 32768 * 2 * (16 + 16) * 2
    k_only = model.predict({"ctx-size": 32768, "cache-type-k": "q8_0"})
    assert k_only.workspace - f16.workspace == 32768 * 2 * 16 * 2
    path = write_tiny_gguf(tmp_path / "host.gguf")
    spec = load_sweep_text(_sweep({"engine": "llama-server", "model": str(path)})).spec
    host = MemoryModel.of_sweep(spec, Capacity(64 * GiB, "host", "test"))
    assert (
        host.predict({"ctx-size": 32768, **q8}).workspace
        == host.predict({"ctx-size": 32768}).workspace
    )
