"""The run's machines as the driver sees them: each by its key (``NodeInfo.key``), made
ready once by the executor before the first trial (leftovers of earlier runs adopted
or stopped, the GPU baseline taken or reused), and which of them are lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from servesweep.models import InstanceRecord
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import params_label, slot_port
from servesweep.store import Store, SweepRecord, TrialRecord
from servesweep.sweep.core.rules import runs_on, slot_of_port, stored_baseline
from servesweep.sweep.core.seams import Executor
from servesweep.sweep.slots.data import NodeInfo, Placement
from servesweep.sweep.slots.node import Leftover, NodePrepared, leftover_of

__all__ = ["Machines", "Wanted"]

Wanted = Sequence[tuple[int, Mapping[str, Any]]]
"""The queued trials (id, parameters) a leftover instance may be adopted for."""


class Machines:
    """The machines of one run (see the module doc); ``slots``: slots per machine."""

    def __init__(self, spec: SweepSpec, executor: Executor, slots: int) -> None:
        self.spec = spec
        self.executor = executor
        self.slots = slots
        self.nodes: dict[str, NodeInfo] = {n.key: n for n in executor.nodes()}
        self.prepared: dict[str, NodePrepared] = {}
        """Each machine made ready, by key (empty until the first trial is placed)."""
        self.baselines: dict[str, dict[int, int]] = {}
        self.dead: set[str] = set()
        """Machines lost for good: they get no more work."""

    def prepare(
        self, store: Store, sweep: SweepRecord, wanted: Wanted, drain: Callable[[], None]
    ) -> None:
        """Make every machine ready (``drain``: apply what preparing one reported) and
        store their baselines with the sweep, for the next run."""
        live = [t for t in store.live_instances() if t.instance is not None]
        for key, info in self.nodes.items():
            pool = Placement(info.name, 0, info.gpus, slot_port(self.spec, 0), info.node_id)
            mine = [t for t in live if t.instance is not None and runs_on(info, t.instance)]
            leftovers = [self._leftover(t, info, wanted) for t in mine]
            prepared = self.executor.prepare(
                info, pool, leftovers, stored_baseline(sweep, key), range(self.slots)
            )
            drain()
            self.prepared[key] = prepared
            self.baselines[key] = dict(prepared.baseline)
        environment = dict(store.sweep(sweep.id).environment)
        environment["baseline_bytes"] = {
            node: {str(g): v for g, v in values.items()} for node, values in self.baselines.items()
        }
        store.set_environment(sweep.id, environment)

    def _leftover(self, trial: TrialRecord, node: NodeInfo, wanted: Wanted) -> Leftover:
        """A recorded live instance; kept for adoption when a queued trial would run
        exactly its launch on exactly its slot (``node.leftover_of``)."""
        assert trial.instance is not None
        pool = tuple(self.spec.server.gpus)
        slots = [
            Placement(node.name, k, pool, slot_port(self.spec, k), node.node_id)
            for k in range(self.slots)
        ]
        context = self.executor.context_for(node)
        label = params_label(trial.params)
        return leftover_of(context, trial.id, trial.instance, slots, wanted, label)

    def adopted(self) -> Iterator[tuple[str, Leftover, Placement]]:
        """The leftover instances kept for a queued trial: machine, leftover, and the
        slot it runs on."""
        for key, prepared in self.prepared.items():
            for left in prepared.adopted:
                assert left.adopt_for is not None
                yield key, left, self._placement_of(self.nodes[key], left.instance)

    def _placement_of(self, info: NodeInfo, instance: InstanceRecord) -> Placement:
        slot = slot_of_port(self.spec, self.slots, instance.port)
        assert slot is not None
        return Placement(info.name, slot, tuple(instance.gpus), instance.port or 0, info.node_id)

    def baseline(self, node: str, gpus: Sequence[int]) -> dict[int, int]:
        """The GPU baseline of ``gpus`` on machine ``node``."""
        values = self.baselines.get(node, {})
        return {g: values[g] for g in gpus if g in values}

    def restart_units(self, node: str) -> tuple[str, ...]:
        """The systemd units to give back on ``node`` at the end (running before)."""
        prepared = self.prepared.get(node)
        return prepared.restart_services if prepared else ()

    def alive(self) -> list[NodeInfo]:
        return [n for key, n in self.nodes.items() if key not in self.dead]

    def largest(self) -> int:
        """The GPUs of the largest machine not lost (0: none left)."""
        return max((len(n.gpus) for n in self.alive()), default=0)
