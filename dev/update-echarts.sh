#!/usr/bin/env bash
# Put the pinned Apache ECharts build into the HTML report's assets (package data):
#   dev/update-echarts.sh [VERSION]
# Takes dist/echarts.min.js, LICENSE and NOTICE from the npm package. Changing the
# version means changing ECHARTS_VERSION in src/servesweep/report/html.py and the
# checksum in tests/unit/test_report_assets.py, and rerunning the Chromium tests.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-6.1.0}"
assets=src/servesweep/report/assets
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "echarts@$version" >/dev/null && tar xzf "echarts-$version.tgz")
cp "$work/package/dist/echarts.min.js" "$assets/echarts.min.js"
cp "$work/package/LICENSE" "$assets/ECHARTS-LICENSE.txt"
cp "$work/package/NOTICE" "$assets/ECHARTS-NOTICE.txt"
sha256sum "$assets/echarts.min.js"
