#!/usr/bin/env python3
"""Rewrite the generated metric catalog in docs/sweep-file.md from
servesweep.metrics_catalog (run it after adding or changing a metric):

    .venv/bin/python dev/metric-catalog-docs.py

tests/unit/test_metric_catalog.py fails while the docs and the catalog disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from servesweep.metrics_catalog import DOCS_FILE, replace_docs_block


def main() -> int:
    path = Path(__file__).resolve().parents[1] / DOCS_FILE
    text = path.read_text(encoding="utf-8")
    new = replace_docs_block(text)
    if new == text:
        print(f"{DOCS_FILE}: the metric catalog is up to date")
        return 0
    path.write_text(new, encoding="utf-8")
    print(f"{DOCS_FILE}: wrote the metric catalog")
    return 0


if __name__ == "__main__":
    sys.exit(main())
