#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, lint, types, unit and integration tests.
# GPU tests (marker gpu) run on a GPU machine through dev/gpu-tests.sh.
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
.venv/bin/pytest -m "unit or integration" -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then  # pytest: no tests collected (e.g. a -k that matches nothing)
    echo "pytest collected no tests; nothing failed" >&2
    exit 0
fi
exit "$rc"
