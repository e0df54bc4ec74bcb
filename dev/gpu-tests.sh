#!/usr/bin/env bash
# The GPU test tier (pytest -m gpu, tests/gpu) on a machine with NVIDIA GPUs, in one
# command: the device machine's call is just `bash dev/gpu-tests.sh` (or
# `bash dev/gpu-tests.sh smoke` for the quick check of the servers and NVML).
#
# - installs the wheels carried in .whl/ (pydantic & co., missing from the device
#   image) when pydantic is missing, into /tmp/site, and puts src/ on PYTHONPATH (no pip install of servesweep);
# - keeps NVLink multicast off in every process (NCCL_NVLS_ENABLE=0,
#   TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1);
# - writes machine.txt (nvidia-smi, driver, torch), pytest.log, junit.xml,
#   summary.jsonl (one line of measured figures per test) and results.tar.gz (sweep
#   files, stores, server logs, reports, NVML traces) into $OUT (default out/gpu).
# Extra arguments after the mode go to pytest (e.g. -k tp).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${OUT:-$ROOT/out/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
MODE="${1:-full}"
[ $# -gt 0 ] && shift

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

if ! "$PY" -c 'import pydantic' 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "wheel install failed" >&2; exit 2; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

RESULTS="${GPU_TEST_RESULTS:-/tmp/gpu-results}"
rm -rf "$RESULTS" && mkdir -p "$RESULTS"
export GPU_TEST_RESULTS="$RESULTS"

{
    date -u
    nvidia-smi
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv
    nvidia-smi topo -m
    uname -r
    echo "cpus: $(nproc)"
    free -g
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
    "$PY" -c 'import servesweep, pydantic, yaml, aiohttp, pynvml; print("servesweep imports with pydantic", pydantic.VERSION)'
    env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# NVML against nvidia-smi, the multi-GPU tests (issue 8), the single-GPU ones, the rest.
ORDER="tests/gpu/test_gpu_smi.py tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_sweep.py"
ORDER="$ORDER tests/gpu/test_gpu_orphan.py tests/gpu/test_gpu_foreign.py tests/gpu/test_gpu_servers.py"
ORDER="$ORDER $(ls tests/gpu/test_*.py | grep -v -F -e test_gpu_tp.py -e test_gpu_sweep.py \
    -e test_gpu_orphan.py -e test_gpu_foreign.py -e test_gpu_smi.py -e test_gpu_servers.py | tr '\n' ' ')"
case "$MODE" in
    smoke) SELECT=(-k "smi or servers or conformance") ;;
    full) SELECT=() ;;
    *) echo "usage: dev/gpu-tests.sh [smoke|full] [pytest args]" >&2; exit 2 ;;
esac

# shellcheck disable=SC2086
timeout -s INT "${GPU_TESTS_LIMIT:-540}" "$PY" -m pytest -m gpu ${GPU_TEST_PATHS:-$ORDER} -v -p no:cacheprovider \
    -o timeout=400 --junitxml="$OUT/junit.xml" "${SELECT[@]}" "$@" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}

cp "$RESULTS/summary.jsonl" "$OUT/" 2>/dev/null
tar -czf "$OUT/results.tar.gz" -C "$RESULTS" . 2>/dev/null
ls -la "$OUT"
echo "gpu-tests: pytest exit code $rc"
exit "$rc"
