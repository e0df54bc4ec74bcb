"""What asking a ready server what it runs costs a trial: wall time of
``servesweep.servers.config_check.check_server`` against the simulated engine (one
``GET /v1/models`` through the gates' HTTP helper, and the comparison).

    .venv/bin/python bench/config_check_cost.py            # 50 checks

Prints the median and the largest, in ms (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from servesweep.servers.config_check import check_server
from servesweep.sim.testing import running_sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=50)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_sim(["--load-time", "0.2", "--max-model-len", "8192"], workdir) as run,
    ):
        run.wait_ready()
        times = []
        found = []
        for _ in range(args.checks):
            start = time.perf_counter()
            found = check_server("sim", "127.0.0.1", run.port, {"max-model-len": 8192})
            times.append((time.perf_counter() - start) * 1000)
    print(f"mismatches found: {[m.describe() for m in found]}")
    print(f"{args.checks} checks: median {statistics.median(times):.1f} ms, "
          f"max {max(times):.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
