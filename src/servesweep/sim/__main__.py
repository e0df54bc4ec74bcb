"""``python -m servesweep.sim [flags]``: run the simulated inference engine."""

from __future__ import annotations

import sys

from servesweep.sim import main

if __name__ == "__main__":
    sys.exit(main())
