"""Launchers: run, identify, observe and stop one server instance.

``make_launcher(spec)`` picks the implementation named by ``server.launcher``:
``subprocess`` (default) and ``command`` live here; ``systemd`` and ``docker`` are
imported only when asked for, so a missing or broken module is a clear
:class:`~servesweep.errors.LaunchError` instead of an import failure at start-up.
"""

from __future__ import annotations

import importlib

from servesweep.errors import LaunchError
from servesweep.servers.launchers.base import ExitStatus, Launcher, LaunchRequest, StopResult
from servesweep.spec.schema import ServerSpec

__all__ = ["ExitStatus", "LaunchRequest", "Launcher", "StopResult", "make_launcher"]

_LAZY = {
    "systemd": ("servesweep.servers.launchers.systemd", "SystemdLauncher"),
    "docker": ("servesweep.servers.launchers.docker", "DockerLauncher"),
}


def make_launcher(spec: ServerSpec) -> Launcher:
    """The launcher for ``spec.launcher``; raises LaunchError when it cannot be built."""
    kind = spec.launcher
    if kind == "subprocess":
        from servesweep.servers.launchers.subprocess import SubprocessLauncher

        return SubprocessLauncher()
    if kind == "command":
        from servesweep.servers.launchers.command import CommandLauncher

        return CommandLauncher(spec)
    if kind not in _LAZY:
        raise LaunchError(
            f"unknown launcher {kind!r} (known: subprocess, command, systemd, docker)"
        )
    module_name, class_name = _LAZY[kind]
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, class_name)
    except (ImportError, AttributeError) as exc:
        raise LaunchError(
            f"the {kind} launcher is not available in this installation ({exc})"
        ) from exc
    launcher = factory(spec)
    if not isinstance(launcher, Launcher):
        raise LaunchError(f"{module_name}.{class_name} does not implement the Launcher interface")
    return launcher
