"""servesweep: sweep the launch configuration of LLM inference servers, safely."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
