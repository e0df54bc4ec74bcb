#!/usr/bin/env bash
# Build llama.cpp's own server, `llama-server`, once per machine and cache the binary.
# Prints the binary's path as the last line of stdout (progress goes to stderr).
#
#   dev/install-llama-server.sh                  CPU build (what CI runs)
#   dev/install-llama-server.sh --cached         print the cached binary's path, or exit 1
#   LLAMA_SERVER_CUDA_ARCH=90 dev/install-llama-server.sh      CUDA build for sm_90 only
#
# The source is llama.cpp's tree vendored in the llama-cpp-python sdist (a registry
# package; no git clone): the sdist is fetched once with pip into the cache, or taken
# from LLAMA_SERVER_SOURCE (an unpacked llama.cpp tree: for machines without a registry).
#
# Environment:
#   LLAMA_SERVER_VERSION     llama-cpp-python version whose llama.cpp is built
#                            (default: 0.3.36, the version the project pins)
#   LLAMA_SERVER_SOURCE      build this llama.cpp tree instead (no download)
#   LLAMA_SERVER_CUDA_ARCH   CUDA architectures (e.g. 90); unset: CPU only
#   LLAMA_SERVER_CMAKE_ARGS  more cmake flags, e.g. a portable static build:
#                            "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DCMAKE_EXE_LINKER_FLAGS=-static"
#   LLAMA_SERVER_CACHE       cache folder (default: ~/.cache/servesweep/llama-server)
#   CMAKE_BUILD_PARALLEL_LEVEL   compile jobs (default: 2)
#   PYTHON                   the Python whose pip fetches the sdist (default: python3)
#
# Cache layout: <cache>/<version>-<variant>/llama-server and BUILD-INFO. A build runs in
# a temporary folder beside it and is renamed into place only after the binary has
# answered --version, so a build interrupted half-way is never taken as done (its
# leftovers are removed by the next run). A lock serialises concurrent builds.
set -euo pipefail

VERSION="${LLAMA_SERVER_VERSION:-0.3.36}"
SOURCE="${LLAMA_SERVER_SOURCE:-}"
CUDA_ARCH="${LLAMA_SERVER_CUDA_ARCH:-}"
EXTRA="${LLAMA_SERVER_CMAKE_ARGS:-}"
CACHE="${LLAMA_SERVER_CACHE:-$HOME/.cache/servesweep/llama-server}"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
PYTHON="${PYTHON:-python3}"
SDIST_CACHE="$(dirname "$CACHE")/sdist"

say() { printf 'install-llama-server: %s\n' "$*" >&2; }

# The variant names what the binary can run on: a native CPU build is tied to this
# CPU's instruction set, a CUDA build to its architectures.
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-8)"
if [ -n "$CUDA_ARCH" ]; then
    variant="cuda${CUDA_ARCH//[^0-9a-z]/_}-cpu$cpu_flags"
else
    variant="cpu$cpu_flags"
fi
[ -n "$EXTRA" ] && variant="$variant-x$(printf %s "$EXTRA" | md5sum | cut -c1-6)"
label="$VERSION"
[ -n "$SOURCE" ] && label="src-$(basename "$(cd "$SOURCE" && pwd)")"
key="$label-$variant"
dest="$CACHE/$key"

usable() { [ -f "$dest/BUILD-INFO" ] && "$dest/llama-server" --version >/dev/null 2>&1; }

if usable; then
    say "cached: $dest/llama-server"
    echo "$dest/llama-server"
    exit 0
fi
if [ "${1:-}" = "--cached" ]; then
    say "no usable build of $key in $CACHE (run dev/install-llama-server.sh)"
    exit 1
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-$key"
if ! flock -n 9; then
    say "another build of $key is running; waiting for it"
    flock 9
fi
if usable; then  # the other build finished meanwhile
    echo "$dest/llama-server"
    exit 0
fi
rm -rf "$CACHE/.build-$key".* "$dest"  # leftovers of an interrupted build

work="$(mktemp -d "$CACHE/.build-$key.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if [ -z "$SOURCE" ]; then
    sdist="$SDIST_CACHE/llama_cpp_python-$VERSION.tar.gz"
    if [ ! -f "$sdist" ]; then
        say "fetching the llama-cpp-python $VERSION sdist (llama.cpp's source) with pip"
        mkdir -p "$SDIST_CACHE"
        "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
            --dest "$work/sdist" "llama-cpp-python==$VERSION" >&2
        mv "$work/sdist/llama_cpp_python-$VERSION.tar.gz" "$sdist.part"
        mv "$sdist.part" "$sdist"
    fi
    say "unpacking llama.cpp from $(basename "$sdist")"
    mkdir -p "$work/unpack"
    tar -xzf "$sdist" -C "$work/unpack" --wildcards "*/vendor/llama.cpp/*" \
        --exclude "*/vendor/llama.cpp/models/*" --exclude "*/vendor/llama.cpp/docs/*" \
        --exclude "*/vendor/llama.cpp/media/*"
    SOURCE="$(echo "$work"/unpack/*/vendor/llama.cpp)"
fi
[ -f "$SOURCE/CMakeLists.txt" ] || { say "no llama.cpp tree at $SOURCE"; exit 2; }

flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF          # one self-contained binary that can be moved
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_USE_PREBUILT_UI=OFF      # no web UI download at build time
    -DLLAMA_OPENSSL=OFF
)
command -v ninja >/dev/null 2>&1 && flags+=(-G Ninja)
if [ -n "$CUDA_ARCH" ]; then
    flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH")
fi
# shellcheck disable=SC2206  # split on purpose: several flags in one variable
[ -n "$EXTRA" ] && flags+=($EXTRA)

say "building llama-server ($key, $JOBS jobs): a few minutes"
t0=$(date +%s)
cmake -S "$SOURCE" -B "$work/build" "${flags[@]}" >"$work/configure.log" 2>&1 \
    || { tail -40 "$work/configure.log" >&2; say "cmake configure failed"; exit 1; }
cmake --build "$work/build" --target llama-server -j "$JOBS" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; say "build failed"; exit 1; }
binary="$work/build/bin/llama-server"
built_version="$("$binary" --version 2>&1 | tr '\n' ' ')" \
    || { say "the built llama-server does not run: $built_version"; exit 1; }

mkdir -p "$work/out"
cp "$binary" "$work/out/llama-server"
{
    echo "llama-cpp-python sdist: $VERSION"
    echo "source: ${LLAMA_SERVER_SOURCE:-sdist}"
    echo "variant: $variant"
    echo "cmake: ${flags[*]}"
    echo "llama-server --version: $built_version"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - t0 ))s"
} >"$work/out/BUILD-INFO"
mv "$work/out" "$dest"  # atomic: the cache entry appears complete or not at all
say "built in $(( $(date +%s) - t0 ))s: $dest/llama-server"
echo "$dest/llama-server"
