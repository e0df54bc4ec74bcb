"""servesweep's simulated inference engine and fake GPUs (docs/sim.md, docs/fake-gpus.md).

``main(argv)`` runs the engine (``python -m servesweep.sim``); the fake GPUs live in
:mod:`servesweep.fakegpu`, the correctness oracle in :mod:`servesweep.sim.oracle`.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the simulated engine with command-line ``argv``; returns the exit code.

    Invalid flags print argparse's ``error: ...`` and return 2. ``prog`` is the program
    name that usage, ``--help`` and errors show (default ``python -m servesweep.sim``).
    """
    import asyncio
    import sys

    from servesweep.sim.config import PROG, parse_args
    from servesweep.sim.process import SimProcess

    try:
        cfg = parse_args(argv, prog or PROG)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:  # log lines reach a pipe as they happen
            reconfigure(line_buffering=True)
    return asyncio.run(SimProcess(cfg).run())
