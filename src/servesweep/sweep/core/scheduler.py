"""Which trial runs where next: packing trials onto the GPUs of each machine.

Pure decisions, no processes: the driver asks :meth:`Scheduler.decide` after every
change and carries the actions out. The rules:

* a trial never shares a GPU with another running trial; a slot's GPUs stay its own
  until the slot is torn down (its instance stopped and the memory back);
* largest GPU count first, then fill: the queue is served in order of GPUs needed
  (most first), then the order the driver gives (the plan's, or the search's);
* an idle slot with the same number of GPUs takes the next trial (its instance is
  stopped in that trial's ``stop`` phase, exactly as in a one-slot sweep);
* otherwise a new slot on free GPUs, chosen to be directly linked when the machine
  reports its topology (NVLink, then the closest PCIe ancestor);
* a trial that fits only once idle slots are torn down gets those GPUs reserved, so
  smaller trials cannot take them in the meantime;
* at most ``max_slots`` slots exist per machine at once (``--slots`` / ``parallel``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Assign", "Decision", "Job", "NodePool", "Open", "Scheduler", "SlotView", "Teardown"]

LinkDistance = Callable[[int, int], int]
"""Distance between two GPUs of a machine: 0 for NVLink, larger for farther PCIe paths."""

_EXHAUSTIVE_LIMIT = 4000


@dataclass(frozen=True)
class Job:
    trial: int
    need: int
    """GPUs the trial needs."""


@dataclass(frozen=True)
class SlotView:
    """What the scheduler knows of a slot."""

    node: str
    slot: int
    gpus: tuple[int, ...]
    busy: bool


@dataclass(frozen=True)
class Assign:
    trial: int
    node: str
    slot: int


@dataclass(frozen=True)
class Open:
    trial: int
    node: str
    slot: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Teardown:
    node: str
    slot: int


Decision = Assign | Open | Teardown


@dataclass
class NodePool:
    """The GPU pool of one machine."""

    node: str
    gpus: tuple[int, ...]
    max_slots: int
    link: LinkDistance | None = None
    reserved: dict[int, set[int]] = field(default_factory=dict)
    """GPUs being freed for a trial (trial -> GPUs), not to be taken by others."""


class Scheduler:
    def __init__(self, pools: Iterable[NodePool]) -> None:
        self.pools = {p.node: p for p in pools}

    def capacity(self) -> int:
        """The most GPUs any one machine offers (a trial needing more never runs)."""
        return max((len(p.gpus) for p in self.pools.values()), default=0)

    def decide(self, queue: Sequence[Job], slots: Sequence[SlotView]) -> list[Decision]:
        """The actions to take now for ``queue`` (trials waiting, in the driver's order)."""
        decisions: list[Decision] = []
        idle = [s for s in slots if not s.busy]
        used: dict[str, set[int]] = {n: set() for n in self.pools}
        lanes: dict[str, set[int]] = {n: set() for n in self.pools}
        for s in slots:
            used.setdefault(s.node, set()).update(s.gpus)
            lanes.setdefault(s.node, set()).add(s.slot)
        taken_idle: set[tuple[str, int]] = set()
        tearing: set[tuple[str, int]] = set()
        waiting = {job.trial for job in queue}
        for pool in self.pools.values():
            for trial in list(pool.reserved):
                if trial not in waiting:
                    del pool.reserved[trial]
        order = sorted(enumerate(queue), key=lambda item: (-item[1].need, item[0]))
        for _, job in order:
            # an idle slot of the same size (reserved GPUs stay with their trial)
            match = next(
                (
                    s
                    for s in idle
                    if len(s.gpus) == job.need
                    and (s.node, s.slot) not in taken_idle
                    and (s.node, s.slot) not in tearing
                    and not self._reserved_for_other(s.node, s.gpus, job.trial)
                ),
                None,
            )
            if match is not None:
                taken_idle.add((match.node, match.slot))
                self._release_reservation(job.trial)
                decisions.append(Assign(job.trial, match.node, match.slot))
                continue
            opened = self._open(job, used, lanes)
            if opened is not None:
                decisions.append(opened)
                continue
            teardown = self._make_room(job, idle, used, taken_idle | tearing)
            for t in teardown:
                tearing.add((t.node, t.slot))
            decisions.extend(teardown)
        return decisions

    # -- helpers ----------------------------------------------------------------------

    def _reserved_for_other(self, node: str, gpus: Iterable[int], trial: int) -> bool:
        pool = self.pools.get(node)
        if pool is None:
            return False
        wanted = set(gpus)
        return any(t != trial and wanted & held for t, held in pool.reserved.items())

    def _release_reservation(self, trial: int) -> None:
        for pool in self.pools.values():
            pool.reserved.pop(trial, None)

    def _open(self, job: Job, used: dict[str, set[int]], lanes: dict[str, set[int]]) -> Open | None:
        for pool in self._pools_for(job):
            if len(lanes[pool.node]) >= pool.max_slots:
                continue
            others = set().union(*(g for t, g in pool.reserved.items() if t != job.trial))
            free = [g for g in pool.gpus if g not in used[pool.node] and g not in others]
            if len(free) < job.need:
                continue
            gpus = pick_gpus(free, job.need, pool.link)
            lane = min(set(range(pool.max_slots)) - lanes[pool.node])
            used[pool.node].update(gpus)
            lanes[pool.node].add(lane)
            self._release_reservation(job.trial)
            return Open(job.trial, pool.node, lane, gpus)
        return None

    def _pools_for(self, job: Job) -> list[NodePool]:
        """Machines that could ever host the job: reserved ones for it first."""
        pools = [p for p in self.pools.values() if len(p.gpus) >= job.need]
        return sorted(pools, key=lambda p: (job.trial not in p.reserved, p.node))

    def _make_room(
        self,
        job: Job,
        idle: Sequence[SlotView],
        used: dict[str, set[int]],
        unavailable: set[tuple[str, int]],
    ) -> list[Teardown]:
        """Free GPUs for ``job`` on the machine where it is closest to fitting: idle
        slots there are torn down and the GPUs they and the free ones give are reserved
        for the job (smaller trials behind it cannot take them); the job starts once
        the trials still running there end."""
        best: tuple[int, NodePool, set[int], list[SlotView]] | None = None
        pools = self._pools_for(job)
        waiting_on = [p for p in pools if job.trial in p.reserved]
        for pool in waiting_on or pools:  # a reservation grows where it was made
            others = set().union(*(g for t, g in pool.reserved.items() if t != job.trial))
            free = {g for g in pool.gpus if g not in used[pool.node] and g not in others}
            candidates = [
                s
                for s in idle
                if s.node == pool.node
                and (s.node, s.slot) not in unavailable
                and not set(s.gpus) & others
            ]
            reachable = len(free) + sum(len(s.gpus) for s in candidates)
            if best is None or reachable > best[0]:
                best = (reachable, pool, free, candidates)
        if best is None:
            return []
        _, pool, free, candidates = best
        chosen: list[SlotView] = []
        for s in sorted(candidates, key=lambda s: (len(s.gpus), s.slot)):
            if len(free) >= job.need:
                break
            chosen.append(s)
            free |= set(s.gpus)
        pool.reserved[job.trial] = free | pool.reserved.get(job.trial, set())
        return [Teardown(s.node, s.slot) for s in chosen]


def pick_gpus(free: Sequence[int], need: int, link: LinkDistance | None) -> tuple[int, ...]:
    """``need`` GPUs of ``free``: the most closely linked set when the topology is known
    (smallest largest pairwise distance, then smallest sum), else the lowest indexes."""
    ordered = sorted(free)
    if link is None or need <= 1:
        return tuple(ordered[:need])

    def cost(group: Iterable[int]) -> tuple[int, int, tuple[int, ...]]:
        group = tuple(group)
        pairs = [link(a, b) for a, b in itertools.combinations(group, 2)]
        return (max(pairs, default=0), sum(pairs), tuple(group))

    if _combinations(len(ordered), need) <= _EXHAUSTIVE_LIMIT:
        best = min(itertools.combinations(ordered, need), key=cost)
        return tuple(best)
    # greedy: grow a group from each GPU, nearest first
    groups = []
    for start in ordered:
        group = [start]
        rest = [g for g in ordered if g != start]
        while len(group) < need:
            nearest = min(rest, key=lambda g: (max(link(g, m) for m in group), g))
            group.append(nearest)
            rest.remove(nearest)
        groups.append(sorted(group))
    return tuple(min(groups, key=cost))


def _combinations(n: int, k: int) -> int:
    import math

    return math.comb(n, k)


def distances(matrix: Mapping[tuple[int, int], int]) -> LinkDistance:
    """A link-distance function from a symmetric table (missing pairs: far)."""

    def link(a: int, b: int) -> int:
        return matrix.get((a, b), matrix.get((b, a), 100))

    return link
