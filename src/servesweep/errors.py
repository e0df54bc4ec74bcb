"""servesweep's exception tree.

Every error that crosses a module boundary is one of these; lower-level errors
(aiohttp, psutil, NVML, sqlite3, subprocess, yaml, pydantic) are translated at the
module that calls them (``raise ConfigError(...) from exc``), so no caller above
has to know a library's exception types.

::

    ServesweepError              base; ``str(err)`` is a one-line message for users
    ├── ConfigError              a sweep file (or CLI option) is invalid: file, line, key
    ├── StoreError               the results database cannot be read or written
    ├── GpuProbeError            a GPU backend failed to answer
    │   └── NoGpuDriverError     no NVIDIA driver / NVML library on this machine
    ├── LaunchError              a launcher could not run its command (systemctl, docker...)
    ├── BenchError               the load generator could not run a workload
    │   └── DatasetError         a prompt dataset file is invalid (names the line)
    ├── SandboxError             the eval sandbox cannot run safely here
    ├── ResourceBusy             another run holds a port or GPU this run needs
    ├── TrialFailed              a trial failed; carries a FailureClass and Evidence.
    │                            The sweep records it as data and goes on.
    └── Interrupted              the user asked servesweep to stop (SIGINT/SIGTERM)

A failed trial is data, not a crash: the trial runner catches ``TrialFailed``,
stores it and continues with the next trial (unless ``--fail-fast``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesweep.models import Evidence, FailureClass

__all__ = [
    "BenchError",
    "ConfigError",
    "DatasetError",
    "GpuProbeError",
    "Interrupted",
    "LaunchError",
    "NoGpuDriverError",
    "ResourceBusy",
    "SandboxError",
    "ServesweepError",
    "StoreError",
    "TrialFailed",
]


class ServesweepError(Exception):
    """Base class of every error servesweep raises on purpose."""


class ConfigError(ServesweepError):
    """A sweep file or a command-line option is invalid.

    ``str()`` gives ``FILE:LINE: KEY: message`` with whatever parts are known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.key = key
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"


class StoreError(ServesweepError):
    """The results database cannot be opened, read or written."""


class GpuProbeError(ServesweepError):
    """A GPU probe backend (NVML or the fake) failed to answer."""


class NoGpuDriverError(GpuProbeError):
    """No NVIDIA driver or NVML library is available on this machine."""


class LaunchError(ServesweepError):
    """A launcher could not run one of its own commands (not a server failure)."""


class BenchError(ServesweepError):
    """The load generator could not run a workload."""


class DatasetError(BenchError):
    """A prompt dataset file is invalid; the message names the file and line."""


class SandboxError(ServesweepError):
    """Model-generated code cannot be run safely on this machine."""


class ResourceBusy(ServesweepError):
    """Another run holds (leases) a port or GPU this run needs; nothing was started."""


class Interrupted(ServesweepError):
    """The user interrupted the sweep (SIGINT or SIGTERM)."""


class TrialFailed(ServesweepError):
    """A trial failed with a classified reason; stored as data, the sweep goes on."""

    def __init__(self, failure_class: FailureClass, evidence: Evidence) -> None:
        self.failure_class = failure_class
        self.evidence = evidence
        super().__init__(f"{failure_class.value}: {evidence.summary()}")
