#!/usr/bin/env bash
# llama.cpp's llama-server on a GPU machine that has no registry: build it with CUDA
# from a carried llama.cpp tree (dev/install-llama-server.sh), then run
# tests/gpu/test_gpu_llama_server.py and tests/gpu/test_gpu_memory.py (the memory
# prediction against NVML) through dev/gpu-tests.sh (wheels from .whl/, gguf among them).
#
#   LLAMA_SRC=/path/to/llama.cpp OUT=/out bash dev/gpu-llama-server.sh
#   GPU_LLAMA_REHEARSAL=1 bash dev/gpu-llama-server.sh     # the same on a CPU machine
#
# Environment: LLAMA_SRC (an unpacked llama.cpp tree; default: the pinned sdist),
# LLAMA_SERVER_CUDA_ARCH (default 90), GPU_LLAMA_BUDGET (seconds for build + tests,
# default 570, inside the device's 10-minute command limit). Writes build.log (with
# BUILD-INFO) and what dev/gpu-tests.sh writes into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out/gpu}"
mkdir -p "$OUT"
t0=$(date +%s)
arch="${LLAMA_SERVER_CUDA_ARCH:-90}"
[ "${GPU_LLAMA_REHEARSAL:-}" = 1 ] && arch=""
bin=$(LLAMA_SERVER_SOURCE="${LLAMA_SRC:-}" LLAMA_SERVER_CUDA_ARCH="$arch" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    dev/install-llama-server.sh 2>>"$OUT/build.log" | tail -n 1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    tail -n 60 "$OUT/build.log"
    echo "gpu-llama-server: the build failed (see build.log)" >&2
    exit 1
fi
build_s=$(( $(date +%s) - t0 ))
{ cat "$(dirname "$bin")/BUILD-INFO"; echo "build (or cache) seconds here: $build_s"; } \
    | tee -a "$OUT/build.log"
export LLAMA_SERVER_BIN="$bin"
GPU_TEST_PATHS="tests/gpu/test_gpu_llama_server.py tests/gpu/test_gpu_memory.py" \
    GPU_TESTS_LIMIT=$(( ${GPU_LLAMA_BUDGET:-570} - build_s )) \
    OUT="$OUT" bash dev/gpu-tests.sh full
