#!/usr/bin/env bash
# Install servesweep into .venv and run the quickstart sweep (the simulated engine
# on fake GPUs, a small speculative-decoding grid, realistic slow release and load).
# Arguments go to `servesweep run`: ./dev/quickstart.sh --port 18500 when port 18400
# is taken (the run names what holds it and a free port).
set -euo pipefail
cd "$(dirname "$0")/.."
./dev/setup.sh
rm -rf examples/.quickstart
exec .venv/bin/servesweep run examples/quickstart.yaml "$@"
