#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, lint, types, unit and integration tests.
# GPU tests (marker gpu) run on a GPU machine through dev/gpu-tests.sh.
#
#   dev/test.sh                          everything
#   dev/test.sh tests/unit -k catalog    arguments go to pytest
#
# The 25 slowest tests are listed at the end (where the time goes, per CI run).
#
# A run that collects no tests (a -k or a path that matches nothing) FAILS: a typo must
# not pass as a green run. Set SERVESWEEP_ALLOW_NO_TESTS=1 when a run is meant to be
# empty (e.g. a filter that matches nothing on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."

./dev/setup.sh --test

echo "== ruff" >&2
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
echo "== mypy --strict" >&2
.venv/bin/mypy
echo "== pytest (unit, integration)" >&2
set +e
# SERVESWEEP_TEST_WORKERS=2 runs the suite on two workers side by side (tests/conftest.py
# keeps a module whole on one worker, the single services' and the real engines' modules
# one after another). One process by default: on 2 cores the second worker's load failed
# load-sensitive vLLM tests (throughput by max-num-seqs, orphans found in time) and the
# systemd fast-exit classification in full runs (docs/benchmarks.md, "Test suite").
workers="${SERVESWEEP_TEST_WORKERS:-0}"
xdist=()
[ "$workers" != 0 ] && xdist=(-n "$workers" --dist loadgroup)
.venv/bin/pytest -m "unit or integration" -p no:cacheprovider --durations=25 "${xdist[@]}" "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then  # pytest: no tests collected
    if [ "${SERVESWEEP_ALLOW_NO_TESTS:-}" = 1 ]; then
        echo "pytest collected no tests (SERVESWEEP_ALLOW_NO_TESTS=1: accepted)" >&2
        exit 0
    fi
    echo "pytest collected no tests: check the paths and -k/-m filters" \
        "(set SERVESWEEP_ALLOW_NO_TESTS=1 if an empty run is intended)" >&2
fi
exit "$rc"
