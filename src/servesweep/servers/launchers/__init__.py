"""Launchers: run, identify, observe and stop one server instance.

``make_launcher(spec)`` picks the implementation named by ``server.launcher``:
``subprocess`` (default), ``command``, ``systemd`` or ``docker``. Each is a plain
class behind :class:`~servesweep.servers.launchers.base.Launcher`; the systemd and
docker launchers need only their command-line tools, found when they first run.
"""

from __future__ import annotations

from servesweep.errors import LaunchError
from servesweep.servers.launchers.base import ExitStatus, Launcher, LaunchRequest, StopResult
from servesweep.servers.launchers.command import CommandLauncher
from servesweep.servers.launchers.docker import DockerLauncher
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.launchers.systemd import SystemdLauncher
from servesweep.spec.schema import ServerSpec

__all__ = ["ExitStatus", "LaunchRequest", "Launcher", "StopResult", "make_launcher"]


def make_launcher(spec: ServerSpec) -> Launcher:
    """The launcher for ``spec.launcher``; raises LaunchError when it cannot be built
    (its section of the sweep file is missing)."""
    kind = spec.launcher
    if kind == "subprocess":
        return SubprocessLauncher()
    if kind == "command":
        return CommandLauncher(spec)
    if kind == "systemd":
        return SystemdLauncher(spec)
    if kind == "docker":
        return DockerLauncher(spec)
    raise LaunchError(f"unknown launcher {kind!r} (known: subprocess, command, systemd, docker)")
