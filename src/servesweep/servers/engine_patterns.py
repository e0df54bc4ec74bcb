"""Fatal log patterns: a log line that means the instance will not become ready.

Each engine's tuple is ordered most specific first: when several lines match,
the readiness gate (``logs.match_fatal``) keeps the earliest pattern of the tuple,
so ``Model path does not exist`` beats the ``Traceback`` header printed before it.

A pattern matches wherever its message appears in a line: engines and launchers
prefix lines with timestamps, log levels or ``[rank0]:``, and Python reports a
module that ``-m`` cannot find inside a longer line (``/usr/bin/python3: Error
while finding module specification for 'sglang.launch_server' (ModuleNotFoundError:
No module named 'sglang')``). Exception names are matched with the ``: `` that
follows them in a raised exception's line, so a quoted ``ImportError(...)`` in a
warning does not count.

Patterns must never match a line that a healthy engine prints while loading: the
readiness gate fails the trial on a match. So the generic ``traceback`` pattern
(last in the tuple) is used only where a traceback at start-up always ends the
process (llama-cpp-python, the simulator); vLLM, SGLang and TensorRT-LLM print
tracebacks of optional imports and retried downloads while loading normally, and
a real failure there either matches a specific pattern or ends the process.

The messages come from the engines' sources (see docs/engines.md for versions):
argparse (vLLM, SGLang, llama-cpp-python), click (TensorRT-LLM), pydantic
settings (llama-cpp-python), ``common/arg.cpp`` and ``tools/server`` (llama.cpp).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from servesweep.decide.memory import OOM_CRASH
from servesweep.models import FailureClass

__all__ = [
    "COMMON_FATAL",
    "CUDA_ERROR",
    "GPU_MEMORY_HELD",
    "LLAMACPP_PY_FATAL",
    "LLAMA_SERVER_ERRORS",
    "LLAMA_SERVER_FATAL",
    "PYTHON_ERRORS",
    "SGLANG_FATAL",
    "TRACEBACK",
    "TRTLLM_ERRORS",
    "TRTLLM_FATAL",
    "VLLM_ERRORS",
    "VLLM_FATAL",
    "FatalPattern",
]


@dataclass(frozen=True)
class FatalPattern:
    """A log line that means the instance will not become ready."""

    pattern: re.Pattern[str]
    failure_class: FailureClass
    reason: str
    advice: str = ""
    """What to try, added to the failure's message."""

    @classmethod
    def of(
        cls, regex: str, failure_class: FailureClass, reason: str, advice: str = ""
    ) -> FatalPattern:
        return cls(re.compile(regex), failure_class, reason, advice)


_CRASH = FailureClass.START_CRASH
_ARGS = FailureClass.INVALID_ARGS

GPU_MEMORY_HELD = FatalPattern.of(
    # vLLM (v1/worker/utils.py request_memory; older versions in gpu_worker.py)
    r"Free memory on device .*on startup is less than desired GPU memory utilization"
    # SGLang (model_runner.py init_torch_distributed), raised unless the check is
    # disabled, when it is only a warning without the exception name
    r"|\b(RuntimeError|ValueError): The memory capacity is unbalanced",
    _CRASH,
    "gpu_memory_held",
    "GPU memory was already taken when the engine started: another process (or an "
    "earlier instance) holds memory on the trial's GPUs; see `servesweep doctor` for "
    "the holders, or lower the engine's GPU memory fraction",
)
"""The engine refuses to start because GPU memory is already taken (by another process,
or an earlier instance whose memory is not back yet)."""
OOM = FatalPattern.of(
    r"CUDA out of memory|torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError"
    r"|CUDA error: out of memory|cudaErrorMemoryAllocation|cudaMalloc failed: out of memory",
    _CRASH,
    OOM_CRASH,
)
PORT_IN_USE = FatalPattern.of(
    r"[Aa]ddress already in use|EADDRINUSE", FailureClass.PORT_IN_USE, "port_in_use"
)
ARGPARSE = FatalPattern.of(
    r"error: unrecognized arguments|error: argument -|: error: the following arguments are "
    r"required|invalid choice: |error: ambiguous option",
    _ARGS,
    "invalid_args",
)
IMPORT_ERROR = FatalPattern.of(r"\b(ModuleNotFoundError|ImportError): ", _CRASH, "import_error")
NCCL = FatalPattern.of(
    r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError", _CRASH, "nccl"
)
CUDA_ERROR = FatalPattern.of(r"CUDA error: |\bcudaError\w+|\bCUDA_ERROR_\w+", _CRASH, "cuda_error")
"""Any other CUDA error (``an illegal memory access was encountered``, ``device-side
assert triggered``); after ``OOM`` in every tuple, so ``CUDA error: out of memory``
stays ``oom``."""
TRACEBACK = FatalPattern.of(r"\bTraceback \(most recent call last\)", _CRASH, "traceback")

COMMON_FATAL: tuple[FatalPattern, ...] = (
    GPU_MEMORY_HELD,
    OOM,
    PORT_IN_USE,
    ARGPARSE,
    IMPORT_ERROR,
    NCCL,
    CUDA_ERROR,
)
"""Patterns every Python-based engine shares (the generic ``traceback`` is not in it)."""

_HF_MODEL_NOT_FOUND = FatalPattern.of(
    r"is not a local folder and is not a valid model identifier|RepositoryNotFoundError"
    r"|HFValidationError: Repo id must|No such file or directory: '[^']*config\.json'"
    r"|Can't load the configuration of|does not appear to have a file named config\.json",
    _ARGS,
    "model_not_found",
)

VLLM_FATAL: tuple[FatalPattern, ...] = (
    GPU_MEMORY_HELD,
    OOM,
    FatalPattern.of(
        r"No available memory for the cache blocks|larger than the available KV cache memory"
        r"|Insufficient memory|not enough KV cache space",
        _CRASH,
        OOM_CRASH,
    ),
    PORT_IN_USE,
    ARGPARSE,
    _HF_MODEL_NOT_FOUND,
    # pydantic prints the validator's own message on the line after its header
    # ("1 validation error for ModelConfig"): that line names what vLLM refused, e.g.
    # "Value error, User-specified max_model_len (4096) is greater than the derived
    # max_model_len (max_position_embeddings=2048.0 ...)"
    FatalPattern.of(r"^\s*(\(\w+ pid=\d+\) )?(Value|Assertion) error, ", _ARGS, "invalid_args"),
    FatalPattern.of(
        r"validation errors? for (Vllm|Model|Speculative|Cache|Parallel|Scheduler|Compilation)"
        r"Config|ValidationError: \d+ validation error",
        _ARGS,
        "invalid_args",
    ),
    IMPORT_ERROR,
    NCCL,
    CUDA_ERROR,
    FatalPattern.of(r"Engine core initialization failed", _CRASH, "engine_init"),
)

SGLANG_FATAL: tuple[FatalPattern, ...] = (
    GPU_MEMORY_HELD,
    OOM,
    FatalPattern.of(
        r"Not enough memory\. Please try to increase --mem-fraction-static"
        r"|max_total_num_tokens=\S+ is too small|KV cache pool is too small",
        _CRASH,
        OOM_CRASH,
    ),
    PORT_IN_USE,
    ARGPARSE,
    _HF_MODEL_NOT_FOUND,
    FatalPattern.of(r"ValueError: --speculative-[a-z-]+ ", _ARGS, "invalid_args"),
    IMPORT_ERROR,
    NCCL,
    CUDA_ERROR,
    FatalPattern.of(r"Scheduler hit an exception|Rank \d+ scheduler is dead", _CRASH, "scheduler"),
)

TRTLLM_FATAL: tuple[FatalPattern, ...] = (
    GPU_MEMORY_HELD,
    OOM,
    # TensorRT-LLM has no start-up check that names memory held by others: short of
    # memory it fails allocating (out of memory) or finds no room for one sequence in
    # the KV cache pool (pyexecutor/resource_manager.py).
    FatalPattern.of(
        r"\[TensorRT-LLM\]\[ERROR\].*out of memory|Impossible to fit in any sequence in kvCache",
        _CRASH,
        OOM_CRASH,
    ),
    PORT_IN_USE,
    FatalPattern.of(
        r"\bError: (No such option|Invalid value|Missing argument|Missing option"
        r"|Got unexpected extra argument)",
        _ARGS,
        "invalid_args",
    ),
    _HF_MODEL_NOT_FOUND,
    FatalPattern.of(
        r"validation errors? for (TorchLlmArgs|TrtLlmArgs|LlmArgs|KvCacheConfig|\w+DecodingConfig)",
        _ARGS,
        "invalid_args",
    ),
    IMPORT_ERROR,
    NCCL,
    CUDA_ERROR,
    FatalPattern.of(r"MPI_ABORT was invoked|mpi4py\.MPI\.Exception", _CRASH, "mpi"),
)

LLAMACPP_PY_FATAL: tuple[FatalPattern, ...] = (
    FatalPattern.of(
        r"failed to allocate buffer|ggml_backend_\w*alloc\w*: failed|cudaMalloc failed",
        _CRASH,
        OOM_CRASH,
    ),
    OOM,
    PORT_IN_USE,
    ARGPARSE,
    FatalPattern.of(
        r"\d+ validation errors? for (Model|Server|ConfigFile)?Settings", _ARGS, "invalid_args"
    ),
    # the exception's line (name, colon), not the traceback's quote of the raising source
    FatalPattern.of(
        r"\b\w+Error: (Model path does not exist: |Config file \S+ not found)",
        _ARGS,
        "model_not_found",
    ),
    FatalPattern.of(
        r"\b\w+Error: (Failed to load model from file|Failed to create llama_context)"
        r"|failed to open GGUF file|error loading model",
        _CRASH,
        "model_load",
    ),
    IMPORT_ERROR,
    CUDA_ERROR,
    TRACEBACK,
)

LLAMA_SERVER_FATAL: tuple[FatalPattern, ...] = (
    FatalPattern.of(
        r"failed to allocate buffer|ggml_backend_\w*alloc\w*: failed|cudaMalloc failed"
        r"|CUDA error: out of memory",
        _CRASH,
        OOM_CRASH,
    ),
    FatalPattern.of(r"couldn't bind HTTP server socket", FailureClass.PORT_IN_USE, "port_in_use"),
    FatalPattern.of(
        r"error: invalid argument: |error while handling argument|error: unknown value for",
        _ARGS,
        "invalid_args",
    ),
    FatalPattern.of(r"failed to open GGUF file '[^']*' \(No such file", _ARGS, "model_not_found"),
    FatalPattern.of(
        r"error loading model|failed to load model|llama_init_from_model: failed",
        _CRASH,
        "model_load",
    ),
    CUDA_ERROR,
)


# -- error lines: what a failure's evidence quotes as the engine's first error ------------
#
# A fatal pattern classifies; the line it matches is often the engine's last word
# (``llama_server: exiting due to model loading error``, vLLM's ``Engine core
# initialization failed. See root cause above.``), not the cause printed before it. The
# evidence also quotes the first line of the log that states an error, found with these
# patterns: most telling first (the first line of the earliest pattern that matches).

_EXCEPTION_LINE = re.compile(r"(?:^|[\s\]):])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S")
"""A raised exception's line (``ValueError: ...``, ``torch.OutOfMemoryError: ...``),
with the prefixes engines add (``[rank0]: ``, ``(EngineCore_DP0 pid=1) ``); not a
traceback's quote of the raising source (``raise ValueError(...)``)."""
_CLI_ERROR = re.compile(r"(?:^|: )error: |^\s*Error: ")
"""argparse (``vllm serve: error: unrecognized arguments``) and click (``Error: No such
option``)."""
_LOGGED_ERROR = re.compile(r"\bERROR\b|\[ERROR\]")
"""A logger's error level (vLLM ``ERROR 12-06 ...``, TensorRT-LLM ``[TensorRT-LLM][ERROR]``,
uvicorn ``ERROR:``)."""

PYTHON_ERRORS: tuple[re.Pattern[str], ...] = (_EXCEPTION_LINE, _CLI_ERROR, _LOGGED_ERROR)
"""The Python engines' error lines: the first raised exception (the root cause of a
chain is printed first), else an argument parser's error, else a logged error."""
VLLM_ERRORS: tuple[re.Pattern[str], ...] = (
    # pydantic's validator message names what vLLM refused (its header does not)
    re.compile(r"^\s*(\(\w+ pid=\d+\) )?(Value|Assertion) error, "),
    *PYTHON_ERRORS,
)
TRTLLM_ERRORS: tuple[re.Pattern[str], ...] = (
    # its logger's error level names the cause (``[TRT-LLM] [RANK 0] [E] Failed to
    # initialize executor on rank 0: [TensorRT-LLM][ERROR] ...``); the exception raised
    # after it only says ``Executor worker returned error``
    re.compile(r"\[TRT-LLM\](?: \[RANK \d+\])? \[E\]|\[TensorRT-LLM\]\[ERROR\]"),
    *PYTHON_ERRORS,
)
LLAMA_SERVER_ERRORS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^(?!.*\bload_backend: )(?=.*\b(error|failed|failure)\b)", re.IGNORECASE),
)
"""llama.cpp's error lines (``error: invalid argument``, ``failed to initialize
speculative decoding context: ...``, ``error loading model``); not ggml's search for
backends, which says ``load_backend: failed to find ggml_backend_init in ...`` of a
library that is not one and goes on."""
