"""A slot's side on its Ray node: the actor (:class:`SlotActor`) and the plain-data
answers that travel back to the driver's handle (``sweep.executors.ray.handle``) for the
commands it sends (``sweep.slots.handle``).

The actor is pinned to its node and asks Ray for the slot's GPUs (``num_gpus``); the
GPU indexes Ray assigns become the slot's, so the records show what Ray gave. Inside,
a ``SlotWorker`` runs the commands (a trial, a teardown, the finish) and sends its
events into a buffer; each command is one streaming call that yields the buffered
events while the work runs and ends with a :class:`Done`. The actor serves several
calls at once, so ``interrupt`` reaches it while a command runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from servesweep.bench.target import Target
from servesweep.errors import BenchError
from servesweep.models import LevelResult
from servesweep.spec.schema import WorkloadSpec
from servesweep.sweep.events import Event
from servesweep.sweep.executors.ray.nodes import BufferChannel, RemoteFailure
from servesweep.sweep.slots.data import CurrentInstance, Placement, SweepContext
from servesweep.sweep.slots.handle import Command, carry_out
from servesweep.sweep.slots.instance import stop_instance
from servesweep.sweep.slots.worker import SlotWorker

__all__ = ["Done", "LoadFrom", "SlotActor", "Started", "on_node"]

_TAKE_S = 0.5


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Run there or nowhere."""
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


# -- answers (plain data: they travel) ---------------------------------------------------


@dataclass(frozen=True)
class Done:
    """The end of a command's stream."""

    failure: RemoteFailure | None = None
    holding: bool = False


@dataclass(frozen=True)
class Started:
    gpus: tuple[int, ...]
    failure: RemoteFailure | None = None


@dataclass(frozen=True)
class LoadFrom:
    """``executor.bench_from: driver``: where the load generator runs instead."""

    node_id: str
    name: str
    node_ip: str
    """The address of the slot's node, for a server listening on every interface."""


# -- on the node ------------------------------------------------------------------------


class SlotActor:
    """The slot's side on its node (see the module doc); a Ray actor."""

    def __init__(
        self,
        context: SweepContext,
        placement: Placement,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
        load_from: LoadFrom | None,
    ) -> None:
        self._context = context
        self._placement = placement
        self._current = current
        self._baseline = dict(baseline)
        self._load_from = load_from
        self._channel = BufferChannel()
        self._worker: SlotWorker | None = None

    def start(self) -> Started:
        """Take the GPUs Ray assigned and make the slot's worker."""
        here = ray.get_runtime_context().get_node_id()
        if here != self._placement.node_id:
            message = f"placed on node {here}, not on {self._placement.node_id}"
            return Started((), RemoteFailure(message))
        gpus = tuple(sorted(int(g) for g in ray.get_gpu_ids()))
        placement = replace(self._placement, gpus=gpus)
        try:
            current = self._current
            if current is not None and tuple(current.instance.gpus) != gpus:
                # Ray gave the slot other GPUs than the instance to adopt holds
                self._stop_elsewhere(current)
                current = None
            self._worker = SlotWorker(
                self._context,
                placement,
                self._channel,
                current=current,
                baseline={g: self._baseline[g] for g in gpus if g in self._baseline},
                load=self._load_remote if self._load_from else None,
            )
        except BaseException as exc:
            return Started(gpus, RemoteFailure.of(exc))
        return Started(gpus)

    def _stop_elsewhere(self, current: CurrentInstance) -> None:
        stop_instance(
            self._context,
            self._placement,
            self._channel,
            current,
            self._baseline,
            warning=f"the instance of trial {current.trial} runs on GPUs other than those "
            "Ray gave its slot: stopping it instead of adopting it",
        )

    def command(self, command: Command) -> Iterator[list[Event] | Done]:
        """Run ``command``, yielding its events as they come, then :class:`Done`."""
        worker = self._worker
        assert worker is not None
        failure: list[RemoteFailure] = []
        done = threading.Event()

        def work() -> None:
            try:
                error = carry_out(worker, command)
                if error is not None:
                    failure.append(RemoteFailure.of(error))
            finally:
                done.set()
                self._channel.wake()

        threading.Thread(target=work, name="slot-command", daemon=True).start()
        while not done.is_set():
            events = self._channel.take(_TAKE_S)
            if events:
                yield events
        rest = self._channel.take(0)
        if rest:
            yield rest
        yield Done(failure[0] if failure else None, holding=worker.current is not None)

    def interrupt(self) -> None:
        if self._worker is not None:
            self._worker.interrupt()

    def restore(self, restart_units: tuple[str, ...]) -> list[Event]:
        if self._worker is not None:
            self._worker.restore(keep_running=False, restart_units=restart_units)
        return self._channel.take(0)

    def take(self) -> list[Event]:
        """Events no command has streamed yet (an interrupt's, between commands)."""
        return self._channel.take(0)

    def close(self) -> list[Event]:
        """The slot is done: its worker lets go of its probe, telemetry and load
        generators; returns the events no command streamed."""
        if self._worker is not None:
            self._worker.close()
        return self._channel.take(0)

    def ping(self) -> bool:
        return True

    def _load_remote(
        self,
        target: Target,
        workload: WorkloadSpec,
        progress: Callable[[str], None],
        after_level: Callable[[LevelResult], bool],
    ) -> list[LevelResult]:
        """The workload from the driver's node. Its levels run there in one go; the
        decision to go on after each level (pruning) is taken as the results come back,
        and the levels after a stop are not kept (as if they had not run)."""
        load = self._load_from
        assert load is not None
        host = target.base_url.split("//", 1)[-1].rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", "::", ""):
            port = target.base_url.rsplit(":", 1)[-1]
            target = replace(target, base_url=f"http://{load.node_ip}:{port}")
        progress(f"load generator on the driver's node {load.name}")
        task = _load_on_node.options(scheduling_strategy=on_node(load.node_id))
        answer = ray.get(task.remote(target, workload, self._context.base_dir))
        if isinstance(answer, RemoteFailure):
            raise answer.error()
        results, ran_on = answer
        where = {"load_generator": f"driver node {load.name}", "load_node_id": ran_on}
        kept = []
        for result in results:
            kept.append(replace(result, info={**result.info, **where}))
            if not after_level(kept[-1]):
                break
        return kept


@ray.remote(num_cpus=0)
def _load_on_node(
    target: Target, workload: WorkloadSpec, base_dir: str | None
) -> tuple[list[LevelResult], str] | RemoteFailure:
    """The load generator on another node (``executor.bench_from: driver``): the
    results, and the node they were measured from."""
    from servesweep.bench.load import LoadOptions, run_workload_sync

    try:
        options = LoadOptions(workers=workload.workers, base_dir=base_dir)
        results = run_workload_sync(target, workload, options)
    except BenchError as exc:
        return RemoteFailure.of(exc)
    return results, ray.get_runtime_context().get_node_id()
