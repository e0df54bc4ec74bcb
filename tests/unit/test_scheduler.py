"""The scheduler's packing decisions, and the GPUs-per-trial and port rules."""

from __future__ import annotations

import itertools

import pytest

from servesweep.errors import ConfigError
from servesweep.spec.load import load_sweep_text
from servesweep.spec.slots import gpu_need, slot_ports
from servesweep.sweep.core.scheduler import (
    Assign,
    Job,
    NodePool,
    Open,
    Scheduler,
    SlotView,
    Teardown,
    distances,
    pick_gpus,
)


def _simulate(
    jobs: list[Job], pool: NodePool, steps: int = 200
) -> list[tuple[int, tuple[int, ...]]]:
    """Run the scheduler against slots that finish one trial per step, oldest first;
    return (trial, gpus) in the order trials started, checking no GPU is shared."""
    sched = Scheduler([pool])
    slots: dict[int, SlotView] = {}
    running: dict[int, int] = {}  # slot -> trial
    started: list[tuple[int, tuple[int, ...]]] = []
    queue = list(jobs)
    for _ in range(steps):
        for d in sched.decide(queue, list(slots.values())):
            if isinstance(d, Teardown):
                del slots[d.slot]
                continue
            job = next(j for j in queue if j.trial == d.trial)
            queue.remove(job)
            if isinstance(d, Open):
                slots[d.slot] = SlotView(d.node, d.slot, d.gpus, True)
            else:
                assert isinstance(d, Assign)
                slots[d.slot] = SlotView(d.node, d.slot, slots[d.slot].gpus, True)
            running[d.slot] = d.trial
            started.append((d.trial, slots[d.slot].gpus))
            busy = [g for s in slots.values() if s.busy for g in s.gpus]
            assert len(busy) == len(set(busy)), "a GPU was given to two running trials"
        if not queue and not running:
            return started
        if running:
            slot = min(running)
            del running[slot]
            s = slots[slot]
            slots[slot] = SlotView(s.node, s.slot, s.gpus, False)
    raise AssertionError("the schedule did not finish")


def test_largest_first_then_fill_and_no_gpu_shared() -> None:
    jobs = [Job(1, 1), Job(2, 4), Job(3, 2), Job(4, 1), Job(5, 4), Job(6, 2), Job(7, 1)]
    started = _simulate(jobs, NodePool("n", tuple(range(8)), max_slots=8))
    order = [t for t, _ in started]
    # the two 4-GPU trials start first, side by side, then the 2s, then the 1s
    assert order[:2] == [2, 5]
    assert set(order[2:4]) == {3, 6}
    assert sorted(order) == [1, 2, 3, 4, 5, 6, 7]
    assert {t: len(g) for t, g in started} == {j.trial: j.need for j in jobs}


def test_idle_slot_of_the_same_size_is_reused() -> None:
    sched = Scheduler([NodePool("n", (0, 1, 2, 3), max_slots=2)])
    idle = SlotView("n", 0, (0, 1), False)
    assert sched.decide([Job(9, 2)], [idle]) == [Assign(9, "n", 0)]


def test_a_big_trial_gets_idle_slots_torn_down_and_its_gpus_reserved() -> None:
    pool = NodePool("n", (0, 1, 2, 3), max_slots=4)
    sched = Scheduler([pool])
    slots = [
        SlotView("n", 0, (0,), False),
        SlotView("n", 1, (1,), True),
        SlotView("n", 2, (2, 3), False),
    ]
    # the 4-GPU trial cannot start while slot 1 runs; idle slots are torn down for it,
    # and a 1-GPU trial queued behind it may not take the freed GPUs
    decisions = sched.decide([Job(1, 4), Job(2, 1)], slots)
    assert set(decisions) == {Teardown("n", 0), Teardown("n", 2)}
    after = [SlotView("n", 1, (1,), True)]
    assert sched.decide([Job(1, 4), Job(2, 1)], after) == []
    finished = [SlotView("n", 1, (1,), False)]
    assert sched.decide([Job(1, 4), Job(2, 1)], finished) == [Teardown("n", 1)]
    assert sched.decide([Job(1, 4), Job(2, 1)], []) == [
        Open(1, "n", 0, (0, 1, 2, 3)),
    ]


def test_max_slots_caps_concurrency() -> None:
    sched = Scheduler([NodePool("n", tuple(range(8)), max_slots=2)])
    decisions = sched.decide([Job(t, 1) for t in range(5)], [])
    assert [type(d) for d in decisions] == [Open, Open]


def test_topology_picks_directly_linked_gpus() -> None:
    # two NVLink islands {0,2,4,6} and {1,3,5,7}; across them a far PCIe path
    table = {(a, b): (0 if a % 2 == b % 2 else 40) for a, b in itertools.combinations(range(8), 2)}
    link = distances(table)
    assert pick_gpus([0, 1, 2, 3, 4, 5], 2, link) in ((0, 2), (1, 3))
    assert set(pick_gpus(list(range(8)), 4, link)) in ({0, 2, 4, 6}, {1, 3, 5, 7})
    assert pick_gpus([0, 1, 2], 2, None) == (0, 1)
    sched = Scheduler([NodePool("n", tuple(range(8)), max_slots=4, link=link)])
    opened = sched.decide([Job(1, 2), Job(2, 2)], [])
    for d in opened:
        assert isinstance(d, Open)
        a, b = d.gpus
        assert link(a, b) == 0


def _spec(server_extra: str, params: str = "grid: {tp: [1, 2, 4]}") -> object:
    text = f"""
name: s
server:
  engine: sim
  gpus: [0, 1, 2, 3, 4, 5, 6, 7]
  {server_extra}
params:
  {params}
workloads: [{{name: chat}}]
"""
    return load_sweep_text(text, "s.yaml").spec


def test_gpus_per_trial_from_a_param_expression() -> None:
    need = gpu_need(_spec('gpus_per_trial: "{param.tp}"'))  # type: ignore[arg-type]
    assert [need.of({"tp": v}) for v in (1, 2, 4)] == [1, 2, 4]
    need = gpu_need(_spec('gpus_per_trial: "{param.tp} * {param.dp}"\n  args: {dp: 2}'))  # type: ignore[arg-type]
    assert need.of({"tp": 2}) == 4
    assert need.of({"tp": 2, "dp": 1}) == 2
    with pytest.raises(ConfigError, match=r"pool .* has 8"):
        need.of({"tp": 8})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("gpus_per_trial: 16", "only 8"),
        ("gpus_per_trial: 3", "does not divide"),
        ('gpus_per_trial: "{param.tpp}"', "did you mean 'tp'"),
        ("gpus_per_trial: 0", "at least 1"),
    ],
)
def test_bad_gpus_per_trial(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gpu_need(_spec(extra))  # type: ignore[arg-type]


def test_slot_ports() -> None:
    assert slot_ports(_spec("port: 9000"), 3) == [9000, 9001, 9002]  # type: ignore[arg-type]
    assert slot_ports(_spec("ports: [7000, 7100]"), 2) == [7000, 7100]  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lists 2"):
        slot_ports(_spec("ports: [7000, 7100]"), 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="beyond 65535"):
        slot_ports(_spec("port: 65535"), 2)  # type: ignore[arg-type]
