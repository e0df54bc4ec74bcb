"""The driver's rule for lost machines, whatever runs the slots: a trial whose node was
lost runs once more, elsewhere; a lost node gets no more work. Slots here are fakes
that report what a cluster's slots report (no processes)."""

from __future__ import annotations

import queue
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from helpers.fake_executor import FakeExecutor, FakeSlot
from servesweep.models import FailureClass, Outcome
from servesweep.spec.load import load_sweep_text
from servesweep.store import Store, open_store
from servesweep.sweep.commands.run import open_sweep
from servesweep.sweep.core.driver import Driver
from servesweep.sweep.core.run_state import RunSettings
from servesweep.sweep.core.search_source import SearchSource
from servesweep.sweep.core.store_writer import StoreWriter
from servesweep.sweep.events import (
    Event,
    NodeLost,
    NullObserver,
    SweepWarning,
    TrialFinished,
    TrialStarted,
)
from servesweep.sweep.slots.data import (
    CurrentInstance,
    NodeInfo,
    Placement,
    SweepContext,
    TrialOrder,
)

_SWEEP = """
name: lost
server:
  engine: sim
  gpus: [0]
  gpus_per_trial: 1
params:
  grid:
    budget: [1, 2, 3, 4, 5]
workloads:
  - name: chat
    concurrency: [1]
    requests: 2
"""


class _Slot(FakeSlot):
    """Answers each command at once through the driver's queue; a trial in ``doomed``
    loses the slot's node (which then dies)."""

    def __init__(
        self, placement: Placement, events: queue.Queue[Event], doomed: set[int], log: list[Any]
    ) -> None:
        super().__init__(placement, events)
        self._doomed = doomed
        self._log = log

    def run(self, order: TrialOrder) -> None:
        p = self.placement
        self._log.append((order.trial, p.node_id))
        self._events.put(
            TrialStarted(trial=order.trial, node=p.node, node_id=p.node_id, slot=p.slot)
        )
        if order.trial in self._doomed:
            self._events.put(NodeLost(trial=order.trial, node=p.node, node_id=p.node_id))
            self._events.put(
                TrialFinished(
                    trial=order.trial,
                    outcome=Outcome.FAILED,
                    failure_class=FailureClass.NODE_LOST,
                )
            )
        else:
            self._events.put(TrialFinished(trial=order.trial, outcome=Outcome.OK))
        self._idle()


class _Cluster(FakeExecutor):
    def __init__(
        self,
        events: queue.Queue[Event],
        nodes: list[str],
        doomed: set[int],
        gpus: Mapping[str, int] | None = None,
        slot: type[_Slot] = _Slot,
    ) -> None:
        sizes = gpus or {}
        super().__init__([NodeInfo(f"host-{n}", tuple(range(sizes.get(n, 1))), n) for n in nodes])
        self._events = events
        self._slot = slot
        self._doomed = doomed
        self.log: list[tuple[int, str]] = []

    def open(
        self,
        placement: Placement,
        *,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
    ) -> _Slot:
        return self._slot(placement, self._events, self._doomed, self.log)


def _run(
    tmp_path: Path,
    nodes: list[str],
    doomed: set[int],
    *,
    text: str = _SWEEP,
    gpus: Mapping[str, int] | None = None,
    slot: type[_Slot] = _Slot,
    db: str = "db",
) -> tuple[Store, _Cluster, int]:
    loaded = load_sweep_text(text)
    store = open_store(tmp_path / db)
    sweep = open_sweep(loaded, store)
    context = SweepContext(
        spec=loaded.spec,
        sweep_id=sweep.id,
        store_id=store.store_id,
        store_path=str(tmp_path / db),
        run="r1",
        log_root=str(tmp_path / "runs"),
    )
    events: queue.Queue[Event] = queue.Queue()
    cluster = _Cluster(events, nodes, doomed, gpus, slot)
    driver = Driver(
        context, store, sweep, cluster, events, NullObserver(), RunSettings(max_slots=1)
    )
    todo = store.trials(sweep.id)
    source = SearchSource(store, sweep, loaded.spec, only=[t.fingerprint for t in todo])
    driver.run(source, todo_count=len(todo), total=len(todo), done=0)
    return store, cluster, sweep.id


def test_a_trial_whose_node_is_lost_runs_again_on_another_node(tmp_path: Path) -> None:
    # 5 trials on 3 one-slot nodes: trials 4, 5 and the retry are placed after the loss
    store, cluster, sweep = _run(tmp_path, ["A", "B", "C"], doomed={2})
    trials = {t.params["budget"]: t for t in store.trials(sweep)}
    lost = trials[2]
    first = [node for trial, node in cluster.log if trial == lost.id]
    assert len(first) == 2 and first[0] != first[1], cluster.log
    assert lost.outcome is Outcome.FAILED and lost.failure_class is FailureClass.NODE_LOST
    assert lost.attempts == 2
    # a lost node never got work again, though work was placed after its loss
    assert len(cluster.log) == 6, cluster.log  # 5 trials and one retry
    for node in first:
        last = max(i for i, (_, n) in enumerate(cluster.log) if n == node)
        assert cluster.log[last] == (lost.id, node), cluster.log
    assert all(trials[b].outcome is Outcome.OK for b in (1, 3, 4, 5))
    kinds = [e["kind"] for e in store.events(sweep)]
    assert kinds.count("node_lost") == 2
    store.close()


def test_the_second_attempt_is_final_when_it_succeeds(tmp_path: Path) -> None:
    store, cluster, sweep = _run(tmp_path, ["A", "B", "C", "D"], doomed=set())
    assert all(t.outcome is Outcome.OK and t.attempts == 1 for t in store.trials(sweep))
    store.close()
    once = {"n": 0}

    class _Flaky(_Slot):
        def run(self, order: TrialOrder) -> None:
            if order.trial == 1 and once["n"] == 0:
                once["n"] += 1
                self._doomed.add(1)
            else:
                self._doomed.discard(1)
            super().run(order)

    store, cluster, sweep = _run(tmp_path, ["A", "B"], set(), slot=_Flaky, db="db2")
    todo = store.trials(sweep)
    trial = store.trial(todo[0].id)
    assert trial.outcome is Outcome.OK and trial.attempts == 2
    assert [n for t, n in cluster.log if t == trial.id] == ["A", "B"]
    store.close()


@pytest.mark.timeout(30)
def test_a_trials_end_may_note_more_events_while_it_is_written(tmp_path: Path) -> None:
    """``--fail-fast`` and the lost-node rule note events from inside the writer's
    handling of a TrialFinished: that must not wait on itself."""
    loaded = load_sweep_text(_SWEEP)
    store = open_store(tmp_path / "db")
    sweep = open_sweep(loaded, store)
    trial = store.trials(sweep.id)[0]
    writer: StoreWriter

    def noted(event: TrialFinished) -> None:
        writer.note(SweepWarning(trial=event.trial, message="noted"))

    writer = StoreWriter(store, sweep.id, NullObserver(), on_finished=noted)
    writer.apply(TrialStarted(trial=trial.id))
    writer.apply(TrialFinished(trial=trial.id, outcome=Outcome.OK))  # (a timeout if it waits)
    assert [e["message"] for e in store.events(sweep.id, "warning")] == ["noted"]
    store.close()


def test_a_trial_that_no_machine_left_can_hold_is_not_run_again(tmp_path: Path) -> None:
    """The only node large enough is lost: its trial stays ``node_lost`` (said in a
    warning) and the sweep goes on with the trials the other node can hold."""
    text = _SWEEP.replace("gpus_per_trial: 1", "gpus_per_trial: '{param.tp}'").replace(
        "budget: [1, 2, 3, 4, 5]", "tp: [2, 1]"
    )
    text = text.replace("gpus: [0]", "gpus: [0, 1]")
    store, cluster, sweep = _run(tmp_path, ["A", "B"], doomed={1}, text=text, gpus={"A": 2})
    by_tp = {t.params["tp"]: t for t in store.trials(sweep)}
    assert by_tp[2].failure_class is FailureClass.NODE_LOST and by_tp[2].attempts == 1
    assert by_tp[1].outcome is Outcome.OK
    assert cluster.log[0] == (by_tp[2].id, "A"), cluster.log
    warnings = [e["message"] for e in store.events(sweep, "warning")]
    assert any("not run again" in w and "needs 2 GPUs" in w for w in warnings), warnings
    store.close()
