#!/usr/bin/env bash
# Check the engine presets against the real engines, with the engines' own code.
# Opt-in, not in CI: it installs vllm and sglang from PyPI (a few GB each) into
# throwaway virtual environments; CPU-only is enough (only the argument parsers
# are imported, no model, no GPU).
#
#   dev/engine-conformance.sh                 # vllm and sglang at the pinned versions
#   dev/engine-conformance.sh sglang          # one of them
#
# For each engine: <dir>/<engine>-<version> is created (kept between runs as a
# cache: delete it to install afresh) and `pip install ENGINE==VERSION` runs in it;
# then dev/engine_conformance.py parses every flag the preset can emit with the
# engine's parser, looks up every metric name the preset reads and every fatal
# log pattern's text in the installed sources, prints each fault on one line,
# writes <dir>/<engine>-<version>.json, and records the version it checked in the
# table at the end of docs/engines.md. Exit 1 when any engine has a fault.
#
# Environment: VLLM_VERSION (default 0.33.0), SGLANG_VERSION (0.5.23),
# CONFORMANCE_DIR (~/.cache/servesweep/conformance), PYTHON (python3, for the venvs).
# TensorRT-LLM is not checked: its wheel needs CUDA and NVIDIA's index to install.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR="${CONFORMANCE_DIR:-$HOME/.cache/servesweep/conformance}"
PYTHON="${PYTHON:-python3}"
declare -A VERSIONS=([vllm]="${VLLM_VERSION:-0.33.0}" [sglang]="${SGLANG_VERSION:-0.5.23}")
engines=("$@")
[ ${#engines[@]} -eq 0 ] && engines=(vllm sglang)
[ -x .venv/bin/python ] || { echo "engine-conformance: run ./dev/setup.sh first" >&2; exit 2; }
mkdir -p "$DIR"

rc=0
for engine in "${engines[@]}"; do
    version="${VERSIONS[$engine]:-}"
    [ -n "$version" ] || { echo "engine-conformance: unknown engine $engine" >&2; exit 2; }
    venv="$DIR/$engine-$version"
    if [ ! -f "$venv/.installed" ]; then
        echo "engine-conformance: installing $engine==$version into $venv (downloads GBs)" >&2
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv" || exit 2
        "$venv/bin/python" -m pip install -q --disable-pip-version-check "$engine==$version" \
            || { echo "engine-conformance: pip install $engine==$version failed" >&2; rc=1; continue; }
        touch "$venv/.installed"
    fi
    .venv/bin/python dev/engine_conformance.py --engine "$engine" --python "$venv/bin/python" \
        --json "$DIR/$engine-$version.json" --docs docs/engines.md || rc=1
done
exit "$rc"
