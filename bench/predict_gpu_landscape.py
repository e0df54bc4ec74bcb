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
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from servesweep.decide.perf import Setting, predict
from servesweep.decide.perf.inputs import measured_of
from servesweep.decide.perf.records import Measured
from servesweep.spec.load import load_sweep
from servesweep.store.sqlite import open_store
from servesweep.sweep.core.predict_gate import setting_of

DRAFT = "spec-draft-n-max"
LEVELS = (1, 4)
METRICS = tuple(f"chat.c{c}.output_throughput" for c in LEVELS)


def _draft(m: Measured) -> int:
    value = m.params.get(DRAFT, 0)
    return int(value) if isinstance(value, int | float) else 0


def load(store_path: Path) -> dict[int, Measured]:
    """Every ok trial of the store by draft length (0: no draft); the last one wins."""
    store = open_store(store_path, readonly=True)
    out: dict[int, Measured] = {}
    for sweep in store.sweeps():
        history = [(t, store.results(t.id, with_samples=False)) for t in store.trials(sweep.id)]
        for m in measured_of(history):
            out[_draft(m)] = m
    return out


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
    args = parser.parse_args(argv)
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
