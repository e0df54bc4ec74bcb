"""The plain data a slot is driven with: the sweep as every slot sees it
(:class:`SweepContext`), where a slot is (:class:`NodeInfo`, :class:`Placement`), the
order of one trial (:class:`TrialOrder`) and the instance running in a slot
(:class:`CurrentInstance`). All of it travels to other machines unchanged (a Ray
actor gets it pickled); nothing here imports the rest of ``sweep``, so the driver, the
executors and the slot runtime can all depend on it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servesweep.bench.target import Target
from servesweep.decide.prune import PrunePolicy
from servesweep.decide.screening import ScreenPolicy
from servesweep.models import InstanceRecord, LevelResult
from servesweep.spec.schema import SweepSpec, WorkloadSpec

__all__ = [
    "CurrentInstance",
    "LoadRunner",
    "NodeInfo",
    "Placement",
    "SweepContext",
    "TrialOrder",
    "this_node",
]

LoadRunner = Callable[
    [Target, WorkloadSpec, Callable[[str], None], Callable[[LevelResult], bool]],
    list[LevelResult],
]
"""Runs one workload against a slot's server — ``(target, workload, progress,
after_level)``, ``after_level`` saying after each level whether to go on — and returns
its level results (raising ``BenchError`` like the load generator): by default the
load generator on the server's machine; on a cluster it may run on another node."""


@dataclass(frozen=True)
class SweepContext:
    """What every slot of one sweep run needs; plain data (it travels to other machines)."""

    spec: SweepSpec
    sweep_id: int
    store_id: str
    """The results database's id: part of every instance's owner tag."""
    store_path: str
    run: str
    """This run's id: instances of other (dead) runs of the database are leftovers."""
    log_root: str
    base_dir: str | None = None
    """Folder of the sweep file: relative dataset and suite paths start there."""
    fake_gpu_dir: str | None = None
    api_key: str | None = field(default=None, repr=False)
    """The server's API key, from the environment; never stored or logged."""
    slots: int = 1
    """How many slots may run at once on a machine: with more than one, each slot's
    load generator runs in processes of its own (never in the driver's interpreter,
    where the slots' threads would compete for it)."""


@dataclass(frozen=True)
class NodeInfo:
    """One machine a sweep runs on."""

    name: str
    """Its hostname, as records store it (``InstanceRecord.node``)."""
    gpus: tuple[int, ...]
    """The GPU pool there."""
    node_id: str = ""
    """The cluster's id of it (Ray's node id); empty on this machine alone."""

    @property
    def key(self) -> str:
        """Unique among the machines of a run (two cluster nodes may share a hostname)."""
        return self.node_id or self.name


@dataclass(frozen=True)
class Placement:
    """Where a slot is: the machine, its slot number there, its GPUs and its port."""

    node: str
    slot: int
    gpus: tuple[int, ...]
    port: int
    node_id: str = ""

    @property
    def node_key(self) -> str:
        return self.node_id or self.node

    @property
    def key(self) -> tuple[str, int]:
        return (self.node_key, self.slot)


@dataclass(frozen=True)
class TrialOrder:
    """One attempt of one trial, as the driver hands it to a slot."""

    trial: int
    seq: int
    attempt: int
    fingerprint: str
    params: Mapping[str, Any]
    log_path: str
    prune: PrunePolicy | None = None
    """When set, the benchmark stops early once the trial can no longer win (see
    ``search.prune``): the outcome is ``pruned`` with the reason."""
    number: int = 0
    """The trial's number within its sweep, for people (0: use ``trial``)."""
    screen: ScreenPolicy | None = None
    """The screening pass (``screening`` in the sweep file): measure the launch's short
    levels first, then in full only when :func:`servesweep.decide.screening.screen_reason`
    finds no reason it cannot win (else the outcome is ``pruned``, reason ``screened``)."""
    relaunch: tuple[int, ...] = ()
    """The confirm phase: measure the finished trial again in launches of these
    numbers (each a fresh start of its configuration), appended to its results."""


@dataclass(frozen=True)
class CurrentInstance:
    """The instance running in the slot, and the trial that started it."""

    trial: int
    instance: InstanceRecord
    model: str | None = None
    """The served model name once a readiness check has proven it generates."""


def this_node() -> str:
    """The name of this machine, as records store it."""
    return socket.gethostname()
