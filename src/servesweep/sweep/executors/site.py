"""Where a run's slots run: this machine (``sweep.executors.local``) or the nodes of a Ray cluster
(``sweep.executors.ray.site``, imported only then).

:func:`open_site` chooses from ``--ray`` and the sweep file's ``executor``; the
orchestrator then asks the :class:`Site` what it asks of any of them, and never which
one it has (as an HTTP client never knows its transport):

* ``check`` — before anything is created: a one-line error for a sweep that cannot
  run there (GPUs no backend sees, a configuration no node can hold), and the
  warnings to show;
* ``scheduled`` — the sweep as the driver schedules it there (a cluster's GPU pool is
  its nodes');
* ``leases`` — the run's hold on the ports and GPUs of every machine it uses;
* ``environment`` — what the run ran on, for the sweep's record;
* ``executor`` — the driver's :class:`~servesweep.sweep.core.seams.Executor` for the run;
* ``close`` — leave (a cluster), also when the run ends before its executor does.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from servesweep.errors import ConfigError
from servesweep.spec.load import LoadedSweep
from servesweep.spec.schema import SweepSpec
from servesweep.sweep.core.seams import Executor
from servesweep.sweep.events import Event
from servesweep.sweep.executors.ray.nodes import check_ray_version
from servesweep.sweep.slots.data import SweepContext

if TYPE_CHECKING:
    import queue

    from servesweep.sweep.executors.ray.executor import RayConnection

__all__ = ["Site", "join_cluster", "open_site"]


class Site(Protocol):
    """Where a run's slots run (see the module doc)."""

    def check(self) -> list[str]:
        """ConfigError, before anything is created, for a sweep that cannot run here;
        the warnings to show otherwise."""
        ...

    def scheduled(self, spec: SweepSpec) -> SweepSpec:
        """The sweep as the driver schedules it here."""
        ...

    def leases(
        self,
        spec: SweepSpec,
        store_path: Path,
        *,
        slots: int,
        wait: bool,
        notify: Callable[[str], None],
    ) -> AbstractContextManager[None]:
        """Hold the run's ports and GPUs (``slots`` slots per machine) while the block
        runs; ResourceBusy when another run holds one (``wait``: wait, telling
        ``notify``)."""
        ...

    def environment(self, context: SweepContext) -> dict[str, Any]:
        """What the run's machines are, for the sweep's environment record (no secrets)."""
        ...

    def executor(self, context: SweepContext, events: queue.Queue[Event]) -> Executor: ...

    def close(self) -> None: ...


def open_site(loaded: LoadedSweep, ray_option: str | None) -> Site:
    """The site of a run: the Ray cluster ``--ray`` (``ray_option``) or the sweep file's
    ``executor`` names, joined; else this machine."""
    cluster = join_cluster(loaded, ray_option)
    if cluster is None:
        from servesweep.sweep.executors.local import LocalSite

        return LocalSite(loaded)
    from servesweep.sweep.executors.ray.site import RaySite

    return RaySite(loaded, cluster)


def join_cluster(loaded: LoadedSweep, ray_option: str | None) -> RayConnection | None:
    """The Ray cluster to run on (``--ray`` or ``executor: {kind: ray}``), joined and
    described; None to run here. Ray is imported only then; ConfigError when it is
    missing, too old or unreachable."""
    executor = loaded.spec.executor
    if ray_option is None and executor.kind != "ray":
        return None
    try:
        import ray
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "ray":
            raise
        message = "Ray is not installed: pip install 'servesweep[ray]'"
        if ray_option is None:
            raise loaded.error(message, "executor.kind") from None
        raise ConfigError(message, key="--ray") from None
    check_ray_version(str(getattr(ray, "__version__", "?")))  # before Ray's newer names
    from servesweep.sweep.executors.ray import executor as ray_executor

    return ray_executor.connect(ray_option or executor.address)
