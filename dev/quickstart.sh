#!/usr/bin/env bash
# Install servesweep into .venv and run the quickstart sweep (the simulated engine
# on fake GPUs, a small speculative-decoding grid, realistic slow release and load).
set -euo pipefail
cd "$(dirname "$0")/.."
./dev/setup.sh
rm -rf examples/.quickstart
exec .venv/bin/servesweep run examples/quickstart.yaml "$@"
