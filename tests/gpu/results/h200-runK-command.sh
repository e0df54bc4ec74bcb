#!/usr/bin/env bash
# Run K: the whole GPU tier (tests/gpu) on one H200, with llama.cpp's CUDA llama-server
# built from the carried tree in parallel with the tests that do not need it.
set -uo pipefail
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
LIMIT=${RUNK_LIMIT:-475}
REAL_OUT=$OUT; W=/tmp/runk; rm -rf $W; mkdir -p $W/a $W/b
log() { echo "[runK +$(el)s] $*" | tee -a $W/runk.log; }
finish() {
    cp $W/a/machine.txt $REAL_OUT/machine.txt 2>/dev/null
    cp $W/a/pytest.log $REAL_OUT/pytest-a.log 2>/dev/null
    cp $W/b/pytest.log $REAL_OUT/pytest-b.log 2>/dev/null
    cat $W/a/summary.jsonl $W/b/summary.jsonl >$REAL_OUT/summary.jsonl 2>/dev/null
    cp $W/build.log $REAL_OUT/build.log 2>/dev/null
    tar -czf $REAL_OUT/junit.tar.gz -C $W a/junit.xml b/junit.xml 2>/dev/null
    tar -cf $REAL_OUT/results.tar -C $W a/results.tar.gz b/results.tar.gz 2>/dev/null
    cp $W/runk.log $REAL_OUT/runk.log
    ls -la $REAL_OUT
}
trap finish EXIT
log "start $(date -u +%H:%M:%S) commit-tree $(git rev-parse --short HEAD 2>/dev/null || echo n/a)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .devrun/whl/*.whl || { log "wheel install failed"; exit 3; }
export PYTHONPATH=/tmp/site
BUILD_LIMIT=$(( LIMIT - 110 - $(el) ))
log "build starts (niced, 16 jobs, limit ${BUILD_LIMIT}s)"
( timeout -s KILL $BUILD_LIMIT env LLAMA_SERVER_SOURCE=$PWD/.devrun/llama.cpp LLAMA_SERVER_CUDA_ARCH=90 \
    CMAKE_BUILD_PARALLEL_LEVEL=16 nice -n 10 dev/install-llama-server.sh >$W/bin.txt 2>$W/build.log
  echo "install-llama-server rc=$? at +$(el)s" >>$W/build.log ) &
BPID=$!
A="tests/gpu/test_gpu_smi.py tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_sweep.py tests/gpu/test_gpu_orphan.py"
A="$A tests/gpu/test_gpu_foreign.py tests/gpu/test_gpu_servers.py tests/gpu/test_gpu_nvml_conformance.py tests/gpu/test_gpu_parallel.py"
log "part A (no llama-server) starts"
OUT=$W/a GPU_TEST_RESULTS=/tmp/gr-a GPU_TEST_PATHS="$A" GPU_TESTS_LIMIT=300 bash dev/gpu-tests.sh full
log "part A done rc=$?"
wait $BPID
bin=$(tail -n 1 $W/bin.txt 2>/dev/null)
log "build done: bin='$bin'"; tail -n 3 $W/build.log
if [ -n "$bin" ] && [ -x "$bin" ]; then
    cat "$(dirname "$bin")/BUILD-INFO" >>$W/build.log; export LLAMA_SERVER_BIN="$bin"
else
    log "no llama-server: the llama-server tests will skip"
fi
BL=$(( LIMIT - $(el) - 8 ))
log "part B (llama-server, memory, sweep memory) starts, limit ${BL}s"
OUT=$W/b GPU_TEST_RESULTS=/tmp/gr-b GPU_TESTS_LIMIT=$BL \
    GPU_TEST_PATHS="tests/gpu/test_gpu_llama_server.py tests/gpu/test_gpu_memory.py tests/gpu/test_gpu_sweep_memory.py" \
    bash dev/gpu-tests.sh full >$W/b.out 2>&1
log "part B done rc=$?"; tail -n 30 $W/b/pytest.log
