"""A search driven by one of Optuna's samplers (random, TPE, NSGA-II), ask-and-tell.

How a proposal is made (:meth:`SampledSearch.ask`):

1. a configuration to run again comes first (an environment failure, or a trial a
   crash left unfinished): its sampler trial is still open and is reused;
2. then ``params.points``, in order (told to the sampler when they are points of the
   space);
3. with a performance guide (``search.predict`` on, one objective, a finite space: the
   driver's performance gate skips what cannot win), the configuration
   :mod:`servesweep.decide.perf.design` picks: the design's first launches, then the
   predicted best or the one whose interval reaches farthest, each told to the
   sampler as a fixed trial (``enqueue_trial``); started warm (``earlier``: the
   earlier sweeps' measurements the performance gate starts from, given by the
   driver), no design: the predicted best first, predicted from them and this sweep's
   trials, the leader still this sweep's own; only among the configurations that
   the memory prediction (``memory``, given by the driver) leaves room for and that
   raise no knob of a trial that crashed out of memory (``design.memory_safe``); when
   the predictor knows nothing that can still win, the sampler's proposal;
4. then the sampler. A proposal that ``exclude``/``when`` forbids is told to the
   sampler as infeasible without launching; one already measured is told the same
   result again; one running in another slot is dropped. After
   :data:`MAX_REJECTED` such proposals in a row, a finite space falls back to an
   unmeasured allowed configuration chosen with the seed; when none is left the
   search is finished.

Results are told with their constraint values (``Trial.set_constraint``: Optuna's
samplers prefer feasible regions); failures that blame the configuration are
infeasible; environment failures are not told (the configuration is proposed again,
at most :data:`ENV_ATTEMPTS` attempts); pruned trials are ``PRUNED`` with the objective
value measured before the stop.

Resume: :class:`SampledSearch` replays the stored trials in the order they were asked
and told (asks at ``started_at``, tells at ``finished_at``), asking the seeded sampler
again each time. With the same seed and order the sampler proposes what it proposed
then, so its state — and the next proposal — is the one the interrupted run would
have had. A guided search is given the memory prediction before it replays (the
guide's proposals depend on it) and reads it as of each replayed ask (``at``: the
moment the replay puts the ask at, the stored trial's start), so that what later
trials calibrated does not change what an earlier ask proposed. Where a stored trial
differs from the replayed proposal (another seed, an edited file, another Optuna), the
stored configuration is added as it is and the replay stops asking the sampler;
nothing measured is proposed again either way.
A trial skipped as predicted worse and launched before the sweep ended comes in the
history twice (``sweep.core.search_source.search_history``): as the skip, where the
sampler proposed it and was told it, then as launched, a result recorded for the
search without a new ask (as when it ran); if that late launch did not finish, it
is handed out again first.
"""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import StudyDirection
from optuna.trial import Trial, TrialState

from servesweep.decide.memory import OOM_CRASH
from servesweep.decide.perf import Measured, Setting, predict
from servesweep.decide.perf.design import design_point, memory_safe, next_launch
from servesweep.decide.perf.gate import PREDICTED_WORSE
from servesweep.decide.perf.inputs import measured_of
from servesweep.decide.verdict import Verdict, VerdictKind
from servesweep.models import LevelResult, Outcome, ServerConfig
from servesweep.records import TrialRecord
from servesweep.search.base import History, MemoryOver, Search
from servesweep.spec.schema import SweepSpec
from servesweep.spec.space import Dimension, SearchSpace, build_space

__all__ = ["ENV_ATTEMPTS", "MAX_REJECTED", "SampledSearch", "make_sampler"]

MAX_REJECTED = 16
"""Proposals in a row that were forbidden or already measured before a finite space
falls back to a seeded pick among the configurations not measured yet."""

EAGER_ALLOWED = 10_000
"""A space of at most this many configurations is listed up front, so that the search
knows when every allowed one is measured."""

ENV_ATTEMPTS = 3
"""Attempts of one configuration that fail because of the environment before the search
stops proposing it."""

DESIGN_TRIES = 6
"""Configurations of the performance guide's design handed out at most (a design launch
that crashes gives way to the next one, at most this many times)."""


def make_sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    """The seeded Optuna sampler of ``search.strategy``."""
    search = spec.search
    seed = search.seed
    if search.strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if search.strategy == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=spec.search.startup,
            multivariate=True,
            constant_liar=True,
        )
    if search.strategy == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, spec.search.startup))
    raise ValueError(f"not a sampling strategy: {search.strategy!r}")


def _distribution(dim: Dimension) -> BaseDistribution:
    if dim.range is None:
        return CategoricalDistribution(tuple(range(len(dim.choices))))
    rng = dim.range
    if rng.is_int:
        step = int(rng.step or 1)
        return IntDistribution(int(rng.low), int(rng.high), log=rng.log, step=step)
    return FloatDistribution(float(rng.low), float(rng.high), log=rng.log, step=rng.step)


def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(logging.WARNING)


class SampledSearch(Search):
    def __init__(
        self,
        spec: SweepSpec,
        history: History = (),
        guide: Setting | None = None,
        earlier: Sequence[Measured] = (),
        memory: MemoryOver | None = None,
    ) -> None:
        super().__init__(spec)
        self.guide = guide if len(self.goal.objectives) == 1 else None
        """What the performance predictor is told (None: the sampler alone proposes)."""
        self.earlier: Sequence[Measured] = earlier if self.guide is not None else ()
        """The earlier sweeps' measurements the performance gate starts from (a warm
        start: the guide skips the design and predicts from them at once)."""
        self._measured: list[Measured] = []
        """What the told trials measured, as the guide's predictor reads it (read once,
        when each is told)."""
        self._design_tries = 0
        self.memory: MemoryOver | None = memory
        """The memory gate's prediction, for the guide (given by the driver, before
        the replay: a replayed ask reads it as the first run did)."""
        self._at: float | None = None
        """The moment of the history the ask being replayed was made at (None: now)."""
        self._crashed: list[Mapping[str, Any]] = []
        """Configurations that ran out of memory."""
        _quiet_optuna()
        self.space: SearchSpace = build_space(spec.params)
        self.distributions = {d.name: _distribution(d) for d in self.space.dimensions}
        directions = [
            StudyDirection.MAXIMIZE if d == "max" else StudyDirection.MINIMIZE
            for d in self.goal.directions
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study = optuna.create_study(sampler=make_sampler(spec), directions=directions)
        self._open: dict[str, Trial | None] = {}
        """Configurations handed out and not told, with their sampler trial (None for a
        point outside the space)."""
        self._configs: dict[str, ServerConfig] = {}
        self._again: deque[str] = deque()
        """Fingerprints to hand out again (environment failures, unfinished trials)."""
        self._given_up: set[str] = set()
        self._points: deque[ServerConfig] = deque(self.space.points)
        self._allowed: frozenset[str] | None = None
        self._allowed_configs: tuple[ServerConfig, ...] = ()
        self._diverged = False
        if (self.space.size or EAGER_ALLOWED + 1) <= EAGER_ALLOWED:
            self._allowed_set()
        self._replay(history)

    # ---- asking ------------------------------------------------------------------

    def ask(self) -> ServerConfig | None:
        while self._again:
            fp = self._again.popleft()
            if fp in self._open and fp not in self._given_up:
                return self._configs[fp]
        if self.trials_left == 0:
            return None
        return self._propose()

    def _propose(self) -> ServerConfig | None:
        """A new configuration: the next point, else the sampler's (see module doc)."""
        while self._points:
            point = self._points.popleft()
            if self._known(point.fingerprint) or self.space.forbidden(point) is not None:
                continue
            return self._hand_out(point, self._fixed_trial(point))
        if self._finished_space():
            return None
        guided = self._guided()
        if guided is not None:
            return self._hand_out(guided, self._fixed_trial(guided))
        for _ in range(MAX_REJECTED):
            trial = self.study.ask(self.distributions)
            config = self.space.config(trial.params)
            fp = config.fingerprint
            if self.space.forbidden(config) is not None:
                self._tell_forbidden(trial)
            elif fp in self.told and self.told[fp].verdict.told:
                self._tell(trial, self.told[fp].verdict)
            elif self._known(fp):
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                return self._hand_out(config, trial)
        return self._fallback()

    def _guided(self) -> ServerConfig | None:
        """The performance guide's pick (see the module doc), or None."""
        if self.guide is None or self._allowed_set() is None:
            return None
        left = [c for c in self._allowed_configs if not self._known(c.fingerprint)]
        left = self._memory_safe(left)
        if not left:
            return None
        measured = self._measured
        draft = self.guide.draft_param
        if self._design_tries < DESIGN_TRIES and not self.earlier:
            space = [c.params for c in self._allowed_configs]
            lefts = [c.params for c in left]
            done = [m.params for m in measured]
            pick = design_point(space, draft, self.spec.search.seed, lefts, done)
            if pick is not None:
                self._design_tries += 1
                return left[lefts.index(pick)]
        if not measured and not self.earlier:
            return None
        predictions = predict(self.guide, [c.params for c in left], measured, self.earlier)
        ref, direction = self.goal.objectives[0]
        index = next_launch(
            predictions,
            ref.key,
            direction,
            self.goal.constraints,
            self._leader(),
            self.spec.decision.threshold,
            self.guide.noise,
        )
        return None if index is None else left[index]

    def _memory_safe(self, configs: Sequence[ServerConfig]) -> list[ServerConfig]:
        """Those of ``configs`` the guide may launch (``design.memory_safe``)."""
        if self.memory is None and not self._crashed:
            return list(configs)
        memory, at = self.memory, self._at

        def over(params: Mapping[str, Any]) -> int | None:
            return None if memory is None else memory(params, at)

        crashed = [(p, over(p)) for p in self._crashed]
        params = [c.params for c in configs]
        safe = memory_safe(params, [over(p) for p in params], crashed)
        return [c for c, ok in zip(configs, safe, strict=True) if ok]

    def _leader(self) -> float | None:
        """The best feasible measured value of the one objective so far."""
        sign = 1.0 if self.goal.directions[0] == "max" else -1.0
        values = [
            v
            for t in self.told.values()
            if t.verdict.feasible and (v := t.verdict.values[0]) is not None
        ]
        return max(values, key=lambda v: sign * v) if values else None

    def _known(self, fp: str) -> bool:
        return fp in self.told or fp in self._open or fp in self._given_up

    def _hand_out(self, config: ServerConfig, trial: Trial | None) -> ServerConfig:
        fp = config.fingerprint
        self._open[fp] = trial
        self._configs[fp] = config
        self.launched.add(fp)
        return config

    def _fixed_trial(self, config: ServerConfig) -> Trial | None:
        """A sampler trial with exactly this configuration, or None when it is not a
        point of the space (then the sampler never hears of it)."""
        sample = self.space.sample_of(config.params)
        if sample is None:
            return None
        self.study.enqueue_trial(sample)
        return self.study.ask(self.distributions)

    def _allowed_set(self) -> frozenset[str] | None:
        if self._allowed is None and self.space.enumerable:
            self._allowed_configs = tuple(self.space.allowed())
            self._allowed = frozenset(c.fingerprint for c in self._allowed_configs)
        return self._allowed

    def _finished_space(self) -> bool:
        """Every allowed configuration of a finite space measured or running."""
        if self._allowed is None:
            size = self.space.size
            if size is None or len(self.launched) + len(self._given_up) < size:
                return False
        allowed = self._allowed_set()
        return allowed is not None and all(self._known(fp) for fp in allowed)

    def _fallback(self) -> ServerConfig | None:
        allowed = self._allowed_set()
        if allowed is None:
            self.notes.append(
                f"the sampler proposed only forbidden or measured configurations "
                f"{MAX_REJECTED} times in a row; the search stops"
            )
            return None
        left = [c for c in self._allowed_configs if not self._known(c.fingerprint)]
        if not left:
            return None
        pick = random.Random(f"{self.spec.search.seed}:{len(self.launched)}").choice(left)
        return self._hand_out(pick, self._fixed_trial(pick))

    # ---- telling -----------------------------------------------------------------

    def tell(self, trial: TrialRecord, results: Sequence[LevelResult]) -> None:
        fp = trial.fingerprint
        verdict = self.judge(trial, results)
        if verdict.kind is VerdictKind.RETRY:
            if fp not in self._open:
                return
            if trial.outcome is Outcome.FAILED and trial.attempts >= ENV_ATTEMPTS:
                self._given_up.add(fp)
                self._close(fp, None)
            elif fp not in self._again:
                self._again.append(fp)
            return
        self._close(fp, verdict)
        self.record(trial, verdict)
        if trial.evidence is not None and trial.evidence.reason == OOM_CRASH:
            self._crashed.append(trial.params)
        if self.guide is not None and results:
            self._measured += measured_of([(trial, results)])

    def _close(self, fp: str, verdict: Verdict | None) -> None:
        optuna_trial = self._open.pop(fp, None)
        if optuna_trial is None:
            return
        if verdict is None or not verdict.told:
            self.study.tell(optuna_trial, state=TrialState.FAIL)
        else:
            self._tell(optuna_trial, verdict)

    def _placeholder(self) -> list[float]:
        """Objective values for an infeasible trial: the worst measured so far (the
        samplers rank infeasible trials by their constraint values, not these)."""
        out = []
        for index, direction in enumerate(self.goal.directions):
            seen = [
                v
                for t in self.told.values()
                if (v := t.verdict.values[index]) is not None and math.isfinite(v)
            ]
            worst = (min(seen) if direction == "max" else max(seen)) if seen else 0.0
            out.append(worst)
        return out

    def _set_constraints(self, trial: Trial, values: Sequence[float]) -> None:
        for index, value in enumerate(values):
            trial.set_constraint(f"c{index}", value)

    def _tell(self, trial: Trial, verdict: Verdict) -> None:
        self._set_constraints(trial, verdict.constraints)
        if verdict.kind is VerdictKind.PRUNED:
            first = verdict.values[0]
            if first is not None and len(self.goal.objectives) == 1:
                trial.report(first, step=0)
            self.study.tell(trial, state=TrialState.PRUNED)
            return
        values: list[float] = []
        for value, fallback in zip(verdict.values, self._placeholder(), strict=True):
            values.append(fallback if value is None else value)
        self.study.tell(trial, values)

    def _tell_forbidden(self, trial: Trial) -> None:
        constraints = [0.0] * (len(self.goal.constraints) + 1)
        constraints[-1] = 1.0
        self._set_constraints(trial, constraints)
        self.study.tell(trial, self._placeholder())

    # ---- resuming ----------------------------------------------------------------

    def _replay(self, history: History) -> None:
        """Ask and tell the stored trials again in the order they happened."""
        events: list[tuple[float, int, int, str, TrialRecord, Sequence[LevelResult]]] = []
        for record, results in history:
            asked = record.started_at if record.started_at is not None else math.inf
            if record.outcome is Outcome.SKIPPED and record.finished_at is not None:
                asked = record.finished_at - 1e-6  # proposed, then skipped unlaunched
            events.append((asked, 1, record.seq, "ask", record, results))
            if record.outcome.final:
                told = record.finished_at if record.finished_at is not None else asked
                events.append((told, 0, record.seq, "tell", record, results))
        events.sort(key=lambda e: (e[0], e[1], e[2]))
        for at, _, _, kind, record, results in events:
            if kind == "ask":
                self._at = at if math.isfinite(at) else None
                self._replay_ask(record)
                self._at = None
            else:
                self.tell(record, results)
        for record, _ in sorted(history, key=lambda item: item[0].seq):
            fp = record.fingerprint
            if fp in self._open and not record.outcome.final and fp not in self._again:
                self._again.append(fp)

    def _replay_ask(self, record: TrialRecord) -> None:
        fp = record.fingerprint
        if fp in self._again:
            self._again.remove(fp)
            return
        config = ServerConfig(params=dict(record.params), fingerprint=fp)
        if fp in self.told and self.told[fp].verdict.reason == PREDICTED_WORSE:
            if not record.outcome.final:  # launched after its skip, not finished: again
                self._open[fp] = None
                self._configs[fp] = config
            return
        if fp in self._open or fp in self.told:
            return  # the same configuration asked again (a retry of a stored trial)
        if not self._diverged:
            proposed = self._propose()
            if proposed is not None and proposed.fingerprint == fp:
                return
            if proposed is not None:
                self._unask(proposed.fingerprint)
            self._diverged = True
            why = "another seed or an edited sweep file"
            if self.guide is None and self.spec.search.predict != "off":
                # the stored trials may be the performance guide's picks, replayed
                # without it (run --no-predict): the driver gave this run no guide
                why += ", or a run guided by the performance prediction continued without it"
            self.notes.append(
                f"trial {record.id} ({config.label()}) is not what the sampler proposes at "
                f"this point ({why}?); the search continues from the stored trials as they are"
            )
        self._points = deque(p for p in self._points if p.fingerprint != fp)
        self._hand_out(config, self._fixed_trial(config))

    def _unask(self, fp: str) -> None:
        """Take back a proposal that was not launched."""
        trial = self._open.pop(fp, None)
        self.launched.discard(fp)
        if trial is not None:
            self.study.tell(trial, state=TrialState.FAIL)

    def describe(self) -> dict[str, Any]:
        """Facts for status lines: strategy, trials asked and told, the sampler."""
        return {
            "strategy": self.spec.search.strategy,
            "launched": len(self.launched),
            "told": len(self.told),
            "sampler_trials": len(self.study.trials),
            "diverged": self._diverged,
        }
