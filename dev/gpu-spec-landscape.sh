#!/usr/bin/env bash
# The speculative-decoding landscape on one GPU (bench/gpu_spec_landscape.py): llama-server
# built with CUDA from a carried llama.cpp tree, a random-weight target and draft, acceptance
# set by --spec-synth-rates, every draft length measured at concurrency 1 and 4.
#
#   OUT=/out bash dev/gpu-spec-landscape.sh 0.8 0.6      # profiles (acceptance a: rate_i = a**i)
#
# Carries (device tool): .devrun/whl (pydantic, gguf, optuna & co. for Python 3.12) and
# .devrun/llama.cpp (llama.cpp's tree from the pinned llama-cpp-python sdist, without models,
# docs, tests, examples and the unused GPU backends; keep scripts/ui-assets.cmake and
# scripts/build-info.sh, which the build runs even with the web UI off). The build and the measured stores stay in
# .gpucache/ (ignored, kept while the machine is warm), so a second call goes on where the
# first stopped; each call puts every profile's reports, stores and logs into $OUT/landscape.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out/gpu}"
CACHE="${GPU_CACHE:-$PWD/.gpucache}"   # the build and the stores: outside the tree survives best
mkdir -p "$OUT" "$CACHE"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .devrun/whl/*.whl || { echo "wheel install failed" >&2; exit 3; }
export PYTHONPATH="/tmp/site:$PWD/src:$PWD" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >"$OUT/machine.txt"
bin=$(LLAMA_SERVER_CACHE=$CACHE/llama-server LLAMA_SERVER_SOURCE=$PWD/.devrun/llama.cpp \
    LLAMA_SERVER_CUDA_ARCH=90 CMAKE_BUILD_PARALLEL_LEVEL=16 \
    dev/install-llama-server.sh 2>>"$OUT/build.log" | tail -n 1)
echo "build (or cache): $(( $(date +%s) - T0 ))s, binary: $bin" | tee -a "$OUT/build.log"
[ -x "$bin" ] || { tail -n 40 "$OUT/build.log"; exit 1; }
left=$(( ${GPU_LANDSCAPE_BUDGET:-570} - ($(date +%s) - T0) ))
echo "landscape: ${left}s left for profiles $*"
timeout -s INT "$left" python3 bench/gpu_spec_landscape.py "$CACHE/land" --binary "$bin" \
    --profiles "$@" 2>&1 | tee -a "$OUT/landscape.log"
# every profile's reports (report.json after --no-predict, report-predict.json after the
# predicting run), stores and logs in one archive (the device returns at most 8 files)
tar -czf "$OUT/landscape.tar.gz" --exclude '*.gguf' -C "$CACHE" land 2>/dev/null
echo "total: $(( $(date +%s) - T0 ))s"
