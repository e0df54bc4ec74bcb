#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, lint, types, unit and integration tests.
# GPU tests (marker gpu) run on a GPU machine through dev/gpu-tests.sh.
#
#   dev/test.sh                          everything
#   dev/test.sh tests/unit -k catalog    arguments go to pytest (to both phases)
#
# pytest runs in two phases: first every module but the exclusive ones on two workers side
# by side (SERVESWEEP_TEST_WORKERS, default 2), then the exclusive modules (marker
# exclusive, the list in tests/conftest.py: a real engine on every core, assertions on
# what it did in its time) in one process, alone. SERVESWEEP_TEST_WORKERS=0 runs
# everything in one process; so does a -m of your own (the phases cannot be told apart).
# The exit status is the first failing phase's. Each phase lists its 25 slowest tests
# (where the time goes, per CI run).
#
# A run that collects no tests (a -k or a path that matches nothing) FAILS: a typo must
# not pass as a green run. One phase collecting nothing is fine while the other ran tests
# (dev/test.sh tests/unit -k catalog selects no exclusive module). Set
# SERVESWEEP_ALLOW_NO_TESTS=1 when a run is meant to be empty (e.g. a filter that matches
# nothing on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."

./dev/setup.sh --test

echo "== ruff" >&2
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
echo "== mypy --strict" >&2
.venv/bin/mypy
workers="${SERVESWEEP_TEST_WORKERS:-2}"
own_marks=0
for arg in "$@"; do
    case "$arg" in -m | -m?*) own_marks=1 ;; esac
done

run_pytest() {  # LABEL ARGS...: one pytest run, its exit status and wall time said after it
    local label=$1 t0=$SECONDS rc
    shift
    echo "== pytest: $label" >&2
    .venv/bin/pytest -p no:cacheprovider --durations=25 "$@"
    rc=$?
    echo "== pytest: $label: exit $rc, $((SECONDS - t0)) s" >&2
    return "$rc"
}

set +e
codes=()
if [ "$workers" = 0 ] || [ "$own_marks" = 1 ]; then
    run_pytest "unit, integration (one process)" -m "unit or integration" "$@"
    codes+=("$?")
else
    # Phase 1: tests/conftest.py keeps a module whole on one worker and the single
    # services' modules (systemd sandbox, dockerd) one after another.
    run_pytest "phase 1 of 2: all but the exclusive modules, $workers workers" \
        -m "(unit or integration) and not exclusive" -n "$workers" --dist loadgroup "$@"
    codes+=("$?")
    # Phase 2: on 2 cores a second worker beside vLLM's CPU build failed its throughput
    # by max-num-seqs (docs/benchmarks.md, "Test suite"): nothing of the suite beside it.
    run_pytest "phase 2 of 2: the exclusive modules, one process, alone" \
        -m "(unit or integration) and exclusive" "$@"
    codes+=("$?")
fi
set -e

rc=0
empty=0
for code in "${codes[@]}"; do
    if [ "$code" = 5 ]; then  # pytest: no tests collected
        empty=$((empty + 1))
    elif [ "$rc" = 0 ]; then
        rc=$code
    fi
done
if [ "$empty" = "${#codes[@]}" ]; then
    if [ "${SERVESWEEP_ALLOW_NO_TESTS:-}" = 1 ]; then
        echo "pytest collected no tests (SERVESWEEP_ALLOW_NO_TESTS=1: accepted)" >&2
        exit 0
    fi
    echo "pytest collected no tests: check the paths and -k/-m filters" \
        "(set SERVESWEEP_ALLOW_NO_TESTS=1 if an empty run is intended)" >&2
    exit 5
fi
[ "$empty" = 0 ] || echo "(a phase that collected no tests is fine: the other ran tests)" >&2
exit "$rc"
