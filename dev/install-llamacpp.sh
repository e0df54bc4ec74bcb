#!/usr/bin/env bash
# Install llama-cpp-python[server] (the real llama.cpp engine servesweep tests against)
# into a Python environment, from a cached wheel when one matches, else build it once
# and cache the wheel.
#
#   dev/install-llamacpp.sh [PYTHON]        default PYTHON: .venv/bin/python
#
# Environment:
#   LLAMACPP_VERSION    version to install (default: 0.3.36, the version docs/engines.md and
#                       the tests were checked against; "latest": newest cached, else newest)
#   WHEEL_CACHE         wheel cache directory (default: ~/.cache/servesweep/wheels)
#   CMAKE_BUILD_PARALLEL_LEVEL   build parallelism when compiling (default: 2)
#
# Idempotent: returns in about a second when the package is already installed.
set -euo pipefail

PYTHON="${1:-.venv/bin/python}"
CACHE="${WHEEL_CACHE:-$HOME/.cache/servesweep/wheels}"
VERSION="${LLAMACPP_VERSION:-0.3.36}"
[ "$VERSION" = latest ] && VERSION=""

if ! command -v "$PYTHON" >/dev/null 2>&1 && [ ! -x "$PYTHON" ]; then
    echo "install-llamacpp: no Python at '$PYTHON' (pass the venv's python as first argument)" >&2
    exit 2
fi

installed="$("$PYTHON" - <<'PY' 2>/dev/null || true
import importlib.metadata as md
try:
    import llama_cpp.server.app  # noqa: F401  (the [server] extra: fastapi, uvicorn, sse)
    print(md.version("llama_cpp_python"))
except Exception:
    pass
PY
)"
if [ -n "$installed" ] && { [ -z "$VERSION" ] || [ "$installed" = "$VERSION" ]; }; then
    echo "install-llamacpp: llama-cpp-python $installed already installed for $PYTHON"
    exit 0
fi

mkdir -p "$CACHE"
pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"

# A cached wheel matches when its version is the one asked for (or any, newest first) and
# its tags fit this interpreter (the wheel is py3-none-<platform>: any CPython 3 here).
pick_wheel() {
    local pattern="llama_cpp_python-${VERSION:-*}-*.whl"
    # shellcheck disable=SC2012
    ls -1t "$CACHE"/$pattern 2>/dev/null | while read -r whl; do
        if "$PYTHON" - "$whl" <<'PY' >/dev/null 2>&1; then echo "$whl"; break; fi
import sys, sysconfig
from pathlib import Path
name = Path(sys.argv[1]).name[:-4]
_, _, py, abi, plat = name.split("-")[-5:] if name.count("-") >= 4 else ("", "", "", "", "")
here = sysconfig.get_platform().replace("-", "_").replace(".", "_")
ok_py = py in ("py3", f"cp{sys.version_info[0]}{sys.version_info[1]}")
ok_plat = plat == "any" or plat.endswith(here.split("_", 1)[-1]) or here in plat
sys.exit(0 if ok_py and ok_plat else 1)
PY
    done
}

wheel="$(pick_wheel || true)"
if [ -z "$wheel" ]; then
    echo "install-llamacpp: no cached wheel in $CACHE for cp$pyver; building llama-cpp-python" \
         "(compiles llama.cpp: ~10 minutes on 2 cores)" >&2
    spec="llama-cpp-python${VERSION:+==$VERSION}"
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$PYTHON" -m pip wheel --no-deps --wheel-dir "$CACHE" "$spec"
    wheel="$(pick_wheel || true)"
    if [ -z "$wheel" ]; then
        echo "install-llamacpp: the build finished but no usable wheel is in $CACHE" >&2
        exit 1
    fi
fi

echo "install-llamacpp: installing $(basename "$wheel") into $PYTHON"
# The [server] extra pulls fastapi, uvicorn, sse-starlette, starlette-context,
# pydantic-settings from the index (pure-Python wheels, no compiling).
"$PYTHON" -m pip install --quiet "${wheel}[server]"
"$PYTHON" -c 'import llama_cpp, llama_cpp.server.app; print("install-llamacpp: llama_cpp", llama_cpp.__version__, "ready")'
