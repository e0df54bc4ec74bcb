"""Session-wide real services shared by every integration test module: one systemd
sandbox and one private dockerd per test session (both are single-instance)."""

from __future__ import annotations

from launcher_services import dockerd, systemd_sandbox

__all__ = ["dockerd", "systemd_sandbox"]
