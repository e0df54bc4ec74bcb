"""The speculative-decoding landscape measured on a GPU (bench/gpu_spec_landscape.py),
predicted from its first launches and compared with what was measured.

For each acceptance profile's store (``OUT/a<profile>/servesweep.db``, every draft length
measured after ``run --no-predict``), the trials of a few draft lengths are given to the
predictor (:func:`servesweep.decide.perf.predict`, as the sweep's gate calls it: levels and
the engine's per-position acceptance counters read from the store by
:func:`~servesweep.decide.perf.inputs.measured_of`), and every other draft length is
predicted at concurrency 1 and 4 and compared with its measurement. Then the best draft
length per concurrency: the one whose measurement or prediction is highest, against the
truly best measured.

    python3 bench/predict_gpu_landscape.py LAND_DIR [--from 0,1,2 0,2,4 ...] [--as-cpu]
    python3 bench/predict_gpu_landscape.py LAND_DIR --guided

``--guided``: ``servesweep run``'s guided sampling search replayed on the measurements,
as bench/gpu_spec_landscape.py ``--guided`` writes its sweep file (the draft lengths
zipped with their rates, the baseline a point, ``tpe``): the search's own ``ask`` and
``tell`` (``create_search`` given the gate's ``guide_of``), each proposal through the
performance gate (``decide_launch`` with the sweep's trust, ``verify`` after each
launch), a launch answered with that configuration's stored levels, and at the end the
skipped ones still open launched. It prints the launch order, each launch's and each
skip's prediction against the measurement, and the best named: what the live run
would do on these measurements (a live run measures each launch anew).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import yaml
from gpu_spec_landscape import GUIDED
from gpu_spec_landscape import params as landscape_params

from servesweep.decide.perf import Prediction, Setting, Trust, predict, verify
from servesweep.decide.perf.gate import still_open
from servesweep.decide.perf.inputs import measured_of
from servesweep.decide.perf.records import Measured
from servesweep.models import LevelResult, Outcome, ServerConfig
from servesweep.records import TrialRecord
from servesweep.search import create_search, goal_of
from servesweep.spec import load_sweep_text
from servesweep.spec.load import load_sweep
from servesweep.store.sqlite import open_store
from servesweep.sweep.core.predict_gate import decide_launch, guide_of, leader_of, setting_of

DRAFT = "spec-draft-n-max"
LEVELS = (1, 4)
METRICS = tuple(f"chat.c{c}.output_throughput" for c in LEVELS)


def _draft(m: Measured) -> int:
    value = m.params.get(DRAFT, 0)
    return int(value) if isinstance(value, int | float) else 0


def load(store_path: Path) -> dict[int, Measured]:
    """Every ok trial of the store by draft length (0: no draft); the last one wins."""
    return {k: measured_of([level])[0] for k, level in levels(store_path).items()}


def levels(store_path: Path) -> dict[int, tuple[TrialRecord, list[LevelResult]]]:
    """Every ok trial of the store and its results, by draft length; the last one wins."""
    store = open_store(store_path, readonly=True)
    out: dict[int, tuple[TrialRecord, list[LevelResult]]] = {}
    for sweep in store.sweeps():
        for t in store.trials(sweep.id):
            results = store.results(t.id, with_samples=False)
            if t.outcome is Outcome.OK and measured_of([(t, results)]):
                value = t.params.get(DRAFT, 0)
                out[int(value) if isinstance(value, int | float) else 0] = (t, list(results))
    return out


def guided(profile_dir: Path) -> list[str]:
    """The guided search replayed on one profile's measurements (see the module doc)."""
    stored = levels(profile_dir / "servesweep.db")
    data = yaml.safe_load((profile_dir / "sweep.yaml").read_text())
    drafter = next(t.params for t, _ in stored.values() if t.params)
    a = float(str(drafter["spec-synth-rates"]).split(",")[0])
    data["params"] = landscape_params(Path(drafter["model-draft"]), a, False, True)
    data.update(GUIDED)
    spec = load_sweep_text(yaml.safe_dump(data)).spec
    setting = guide_of(spec, True)
    assert setting is not None, "the guided sweep file gives the search no guide"
    goal, threshold = goal_of(spec), spec.decision.threshold
    objective = goal.objectives[0][0].key
    search = create_search(spec, [], guide=setting)
    history: list[tuple[TrialRecord, list[LevelResult]]] = []
    skipped: dict[int, tuple[ServerConfig, dict[str, Prediction]]] = {}
    trust = Trust()
    lines = [
        f"{profile_dir.name}: | step | draft | what | predicted | interval | measured | error |",
        "|---|---|---|---|---|---|---|",
    ]
    # every configuration: the gate predicts each beside those not finished
    space = [dict(t.params) for t, _ in stored.values()]

    def made_for(params: dict[str, object]) -> dict[str, Prediction]:
        done = [dict(t.params) for t, _ in history]
        others = [p for p in space if p != params and p not in done]
        return predict(setting, [params, *others], measured_of(history), (), trust)[0]

    truths = {k: measured_of([level])[0].metrics.get(objective, 0.0) for k, level in stored.items()}

    def row(step: str, k: int, what: str, p: Prediction) -> str:
        truth = truths[k]
        if p.value is None or p.low is None or p.high is None:
            return f"| {step} | {k} | {what} | unknown | | {truth:.0f} | |"
        return (
            f"| {step} | {k} | {what} | {p.value:.0f} | {p.low:.0f}-{p.high:.0f} "
            f"| {truth:.0f} | {p.value / truth - 1:+.1%} |"
        )

    def launch(seq: int, config: ServerConfig, made: dict[str, Prediction], what: str) -> None:
        nonlocal trust
        k = int(config.params.get(DRAFT, 0))
        old, results = stored[k]
        record = TrialRecord(
            id=seq, sweep_id=1, seq=seq, fingerprint=config.fingerprint,
            params=dict(config.params), outcome=Outcome.OK, attempts=1,
            started_at=float(seq), finished_at=seq + 0.5, gpus=old.gpus,
        )  # fmt: skip
        search.tell(record, results)
        history.append((record, results))
        lines.append(row(str(seq), k, what, made[objective]))
        got = measured_of([(record, results)])[0].metrics
        for metric, p in made.items():
            if metric in got:
                trust = verify(trust, p, got[metric])

    seq = 0
    while (config := search.ask()) is not None:
        seq += 1
        made = made_for(dict(config.params))
        leader = leader_of(goal, history)
        evidence = decide_launch(made, goal, leader, threshold, str(config.params.get(DRAFT)))
        if evidence is None:
            launch(seq, config, made, "launched")
            continue
        record = TrialRecord(
            id=seq, sweep_id=1, seq=seq, fingerprint=config.fingerprint,
            params=dict(config.params), outcome=Outcome.SKIPPED, evidence=evidence,
            started_at=float(seq), finished_at=float(seq),
        )  # fmt: skip
        search.tell(record, [])
        skipped[seq] = (config, made)
    for number, (config, _) in sorted(skipped.items()):  # the driver's last step
        made = made_for(dict(config.params))
        if still_open(made, leader_of(goal, history), goal.constraints):
            del skipped[number]
            launch(number, config, made, "reopened")
    for number, (config, made) in sorted(skipped.items()):
        lines.append(row(f"{number}", int(config.params.get(DRAFT, 0)), "skipped", made[objective]))
    leader = leader_of(goal, history)
    truly = max(truths, key=lambda k: truths[k])
    if leader is not None:
        best = int(next(t for t, _ in history if t.id == leader.trial).params.get(DRAFT, 0))
        lines.append(
            f"best named: draft length {best} (truly best: {truly}); launched "
            f"{len(history)} of {len(stored)}"
        )
    return lines


def compare(
    profile: str,
    trials: dict[int, Measured],
    given: Sequence[int],
    setting: Setting,
) -> list[dict[str, object]]:
    """Every draft length not in ``given`` predicted from those in it, with ``setting``:
    what the sweep's gate is told of the profile's sweep file (``setting_of``; its
    ``--spec-synth-rates``, one rate per drafted position, follow the draft length)."""
    known = [trials[k] for k in given if k in trials]
    others = sorted(k for k in trials if k not in given)
    configs = [trials[k].params for k in others]
    got = predict(setting, configs, known)
    rows: list[dict[str, object]] = []
    for c in LEVELS:
        metric = f"chat.c{c}.output_throughput"
        best_pred: tuple[float, int] | None = None
        for k in given:
            if k in trials and metric in trials[k].metrics:
                value = trials[k].metrics[metric]
                best_pred = max(best_pred or (value, k), (value, k))
        for k, p in zip(others, got, strict=True):
            pred = p[metric]
            truth = trials[k].metrics.get(metric)
            if pred.value is not None:
                best_pred = max(best_pred or (pred.value, k), (pred.value, k))
            rows.append(
                {
                    "profile": profile,
                    "given": ",".join(map(str, given)),
                    "level": f"c{c}",
                    "draft": k,
                    "measured": truth,
                    "predicted": pred.value,
                    "low": pred.low,
                    "high": pred.high,
                    "basis": pred.basis,
                }
            )
        truly = max((t.metrics[metric], k) for k, t in trials.items() if metric in t.metrics)
        rows.append(
            {
                "profile": profile,
                "given": ",".join(map(str, given)),
                "level": f"c{c}",
                "best_named": best_pred[1] if best_pred else None,
                "best_true": truly[1],
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("land", type=Path)
    parser.add_argument("--from", dest="given", nargs="+", default=["0,1,2", "0,2,4", "0,4,8"])
    parser.add_argument(
        "--as-cpu",
        action="store_true",
        help="read the launches as if on CPUs (a draft model's step costs per drafted token)",
    )
    parser.add_argument(
        "--guided",
        action="store_true",
        help="replay the guided sampling search on the measurements (see the module doc)",
    )
    args = parser.parse_args(argv)
    if args.guided:
        for profile in sorted(p.parent for p in args.land.glob("a*/servesweep.db")):
            print("\n".join(guided(profile)), end="\n\n")
        return 0
    errors: list[float] = []
    inside = total = right = choices = 0
    print("| profile | from | level | draft | measured tok/s | predicted | error | interval | in |")
    print("|---|---|---|---|---|---|---|---|---|")
    bests: list[str] = []
    for store_path in sorted(args.land.glob("a*/servesweep.db")):
        profile = store_path.parent.name[1:]
        trials = load(store_path)
        setting = setting_of(load_sweep(store_path.parent / "sweep.yaml").spec)
        # both levels, as the objective and a constraint would name them
        levels = {f"chat.c{c}": float(c) for c in LEVELS}
        setting = replace(setting, metrics=METRICS, concurrency=levels, cpu=args.as_cpu)
        if len(trials) < 4:
            print(f"{profile}: only {len(trials)} draft lengths measured", file=sys.stderr)
            continue
        for text in args.given:
            given = [int(x) for x in text.split(",")]
            for row in compare(profile, trials, given, setting):
                if "best_named" in row:
                    choices += 1
                    right += row["best_named"] == row["best_true"]
                    bests.append(
                        f"| {profile} | {row['given']} | {row['level']} | {row['best_named']} "
                        f"| {row['best_true']} |"
                    )
                    continue
                truth, value = row["measured"], row["predicted"]
                low, high = row["low"], row["high"]
                if not isinstance(truth, float):
                    continue
                if not isinstance(value, float) or not isinstance(low, float):
                    print(f"| {profile} | {row['given']} | {row['level']} | {row['draft']} "
                          f"| {truth:.0f} | unknown | | | |")  # fmt: skip
                    total += 1
                    continue
                assert isinstance(high, float)
                error = value / truth - 1
                errors.append(abs(error))
                hit = low <= truth <= high
                inside += hit
                total += 1
                print(
                    f"| {profile} | {row['given']} | {row['level']} | {row['draft']} "
                    f"| {truth:.0f} | {value:.0f} | {error:+.1%} | {low:.0f}-{high:.0f} "
                    f"| {'yes' if hit else 'no'} |"
                )
    print()
    print("| profile | from | level | best draft named | truly best |")
    print("|---|---|---|---|---|")
    print("\n".join(bests))
    if errors:
        print(
            f"\n{total} predictions: |error| median {statistics.median(errors):.1%}, max "
            f"{max(errors):.1%}, within 10 %: {sum(e <= 0.10 for e in errors)}/{len(errors)}; "
            f"inside the interval: {inside}/{total}; best draft length named: {right}/{choices}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
