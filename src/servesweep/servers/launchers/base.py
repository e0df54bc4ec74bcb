"""The launcher interface: run, identify, observe and stop one server instance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from servesweep.models import InstanceRecord

__all__ = ["ExitStatus", "LaunchRequest", "Launcher", "StopResult"]


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launcher needs to start one instance of one trial."""

    argv: Sequence[str]
    """Program and arguments, already built by the engine preset."""
    env: Mapping[str, str]
    """Extra environment (CUDA_VISIBLE_DEVICES included); merged over the parent's."""
    host: str
    port: int
    gpus: tuple[int, ...]
    log_path: Path
    trial_key: str
    """A short stable label for names (unit drop-ins, container names): ``<sweep>-<trial id>``."""
    fingerprint: str


@dataclass(frozen=True)
class ExitStatus:
    exit_code: int | None = None
    signal: int | None = None

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        return f"exit code {self.exit_code}"


@dataclass(frozen=True)
class StopResult:
    """How a stop went. ``survivors`` non-empty means ``stop_failed``."""

    seconds: float
    signalled: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


@runtime_checkable
class Launcher(Protocol):
    name: str

    def start(self, request: LaunchRequest) -> InstanceRecord:
        """Start the instance and return its identity at once (do not wait for load).
        Raises LaunchError when the launcher's own machinery fails."""
        ...

    def launch_command(self, request: LaunchRequest) -> str:
        """A shell command a user can copy to start this instance by hand: what the
        launcher runs (``docker run ...``), without servesweep's own bookkeeping (the
        instance tag, labels)."""
        ...

    def poll(self, instance: InstanceRecord) -> ExitStatus | None:
        """None while the instance is alive; its exit status once it has ended."""
        ...

    def pids(self, instance: InstanceRecord) -> set[int]:
        """Every live PID of the instance (its tree / cgroup / container)."""
        ...

    def stop(self, instance: InstanceRecord, grace: float, kill_timeout: float) -> StopResult:
        """Stop the whole instance: graceful signal, ``grace`` seconds, kill what is
        left, wait up to ``kill_timeout`` for every PID to vanish. Never hangs longer;
        survivors are returned (the caller classifies ``stop_failed``)."""
        ...

    def log_tail(self, instance: InstanceRecord, lines: int = 50) -> list[str]:
        """The last lines of the instance's log."""
        ...

    def finish_log(self, instance: InstanceRecord, timeout: float) -> bool:
        """After the instance exited: block, at most ``timeout`` seconds, until its log
        file holds everything it wrote before it exited (a launcher that copies the log
        from a journal or ``docker logs`` lags behind the exit). Returns whether it
        caught up; a log written directly by the instance always has."""
        ...

    def alive(self, instance: InstanceRecord) -> bool:
        """Whether a stored instance (maybe from a crashed earlier run) still runs."""
        ...

    # What only a launcher that manages an existing service (systemd) does; the others
    # inherit these defaults by subclassing the protocol.

    @property
    def warnings(self) -> list[str]:
        """What the service's own settings imply (systemd: ``Type=``, ``KillMode=``),
        worth a warning when a slot opens; none by default."""
        return []

    def restore(self, *, keep_running: bool = False, restart: bool = False) -> str:
        """Give the service back as it was before the sweep (``restart``: start it again,
        as it ran before); returns what was done, for a message ("": nothing to give
        back, the default)."""
        return ""

    def current(self, port: int | None = None) -> InstanceRecord | None:
        """The instance the service runs now outside any trial (on ``port``), so that
        it can be stopped before the sweep; None by default (the launcher starts its
        own processes)."""
        return None
