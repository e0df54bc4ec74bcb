"""The ``servesweep`` command: parse options, call a library entry point, print.

Every error is handled in :func:`main`, in one place: a servesweep error becomes one
line on stderr and an exit code (see docs/architecture.md); nothing a user can
cause prints a traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
from rich.console import Console

from servesweep import __version__
from servesweep.errors import ConfigError, Interrupted, SandboxError, ServesweepError

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


def _console(stderr: bool = False) -> Console:
    """A console that respects NO_COLOR; off a terminal (a pipe, a file, CI) tables get
    160 columns instead of rich's 80, unless COLUMNS says otherwise."""
    no_color = bool(os.environ.get("NO_COLOR"))
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, no_color=no_color, highlight=False, soft_wrap=True, width=width)


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _install_signal_handlers() -> None:
    """First SIGINT/SIGTERM: stop cleanly (raise Interrupted); second: exit at once.
    The store commits every change, so an immediate exit still leaves it consistent."""
    state = {"count": 0}

    def handler(signum: int, frame: FrameType | None) -> None:
        state["count"] += 1
        if state["count"] > 1:
            sys.stderr.write("servesweep: second interrupt, exiting now\n")
            os._exit(EXIT_INTERRUPTED)
        raise Interrupted(f"received {signal.Signals(signum).name}")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


EXIT_CODES_HELP = (
    "Exit codes: 0 every trial ok (or the command succeeded); 1 some trials failed, no "
    "feasible configuration, GPUs not free, or doctor found a problem; 2 usage or "
    "sweep-file error; 3 internal error (a bug: please report it); 130 interrupted."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, "--version", prog_name="servesweep")
def cli() -> None:
    """Sweep the launch configuration of an LLM inference server, safely, and tell
    which configuration is best, with evidence."""


# -- run ------------------------------------------------------------------------------


@cli.command(short_help="Run or continue a sweep.", epilog=EXIT_CODES_HELP)
@click.argument("sweep_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--store", type=click.Path(dir_okay=False, path_type=Path), help="Results database.")
@click.option("--fresh", is_flag=True, help="Start a new sweep instead of continuing the last.")
@click.option("--retry-failed", is_flag=True, help="Run failed and interrupted trials again.")
@click.option("--fail-fast", is_flag=True, help="Stop the sweep at the first failed trial.")
@click.option("--keep-running", is_flag=True, help="Leave the last server running at the end.")
@click.option("--trial", "only", type=int, multiple=True, help="Run only this trial id.")
@click.option(
    "--slots",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many trials at once on a machine (default: as many as fit in the "
    "GPU pool; see server.gpus_per_trial).",
)
@click.option(
    "--keep-results",
    is_flag=True,
    help="Keep results measured before the sweep file changed what a trial measures.",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[ADDRESS]",
    help="Run the trials on the nodes of a Ray cluster, at its head's HOST:PORT (without "
    "one: the sweep file's executor.address, else RAY_ADDRESS, else the cluster on this "
    "machine). Needs pip install 'servesweep[ray]'; see docs/distributed.md.",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Listen on this port instead of server.port (slot k on PORT+k).",
)
@click.option(
    "--wait",
    is_flag=True,
    help="Wait for the ports and GPUs another run holds instead of exiting 1.",
)
@click.option(
    "--no-predict",
    is_flag=True,
    help="Launch every configuration, also those predicted not to fit in memory or not "
    "to beat the best so far.",
)
@click.option("-q", "--quiet", is_flag=True, help="No live progress; print the results only.")
@click.option(
    "--events",
    type=str,
    default=None,
    metavar="FILE|-",
    help="Write one JSON object per state change to FILE or - (stdout).",
)
def run(
    sweep_file: Path,
    store: Path | None,
    fresh: bool,
    retry_failed: bool,
    fail_fast: bool,
    keep_running: bool,
    only: tuple[int, ...],
    slots: int | None,
    keep_results: bool,
    ray_address: str | None,
    port: int | None,
    wait: bool,
    no_predict: bool,
    quiet: bool,
    events: str | None,
) -> None:
    """Run (or continue) the sweep in SWEEP_FILE."""
    from servesweep.cli.display import ProgressDisplay
    from servesweep.sweep.commands.run import RunOptions, run_sweep
    from servesweep.sweep.events import JsonLinesObserver, Observer, Tee

    console = _console()
    events_to_stdout = events == "-"
    display = ProgressDisplay(
        _console(stderr=events_to_stdout),
        quiet=quiet or events_to_stdout,
        err_console=_console(stderr=True),
    )
    observers: list[Observer] = [display]
    events_file = None
    if events:
        if events_to_stdout:
            observers.append(JsonLinesObserver(sys.stdout))
        else:
            try:
                events_file = open(events, "a", encoding="utf-8")  # noqa: SIM115
            except OSError as exc:
                raise ConfigError(
                    f"cannot write events to {events}: {exc.strerror}", key="--events"
                ) from exc
            observers.append(JsonLinesObserver(events_file))
    options = RunOptions(
        store=store,
        fresh=fresh,
        retry_failed=retry_failed,
        fail_fast=fail_fast,
        keep_running=keep_running,
        only=only,
        keep_results=keep_results,
        slots=slots,
        ray=ray_address,
        wait=wait,
        port=port,
        predict=not no_predict,
    )
    _install_signal_handlers()
    try:
        summary = run_sweep(sweep_file, options, Tee(observers))
    finally:
        display.close()
        if events_file is not None:
            events_file.close()
    if not events_to_stdout:
        _print_results(console, summary.store_path, summary.sweep.id)
    raise _Exit(summary.exit_code)


def _print_results(console: Console, store_path: Path, sweep_id: int) -> None:
    """The results table (it ends with the best configuration) and its launch command."""
    from servesweep.decide.best import find_best
    from servesweep.report import render
    from servesweep.store import open_store

    with open_store(store_path, readonly=True) as store:
        data = store.load_sweep_data(sweep_id, with_samples=False)
    color = console.is_terminal and not console.no_color
    console.print(
        render(data, "table", color=color, width=console.width), markup=False, highlight=False
    )
    result = find_best(data)
    if result.feasible and result.trial is not None and result.trial.launch_command:
        console.print(f"launch: {result.trial.launch_command}", markup=False, highlight=False)
    console.print(
        "ranking, exclusions and constraints: servesweep best; plots: servesweep report "
        "--format html --out report.html",
        style="dim",
        markup=False,
        highlight=False,
    )


# -- plan, status ---------------------------------------------------------------------


@cli.command(short_help="The trials a sweep file expands to.")
@click.argument("sweep_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results database (for duration estimates and the performance prediction).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print each trial's predicted memory and performance as JSON.",
)
def plan(sweep_file: Path, store: Path | None, as_json: bool) -> None:
    """Print the trials SWEEP_FILE expands to, the restarts, an estimate, each trial's
    predicted memory per GPU, and its predicted performance (from the trials already
    in the results database)."""
    from servesweep.report.predicted import format_predicted, predict_configs, predicted_json
    from servesweep.servers.memory import MemoryModel
    from servesweep.servers.memory.plan import format_memory, memory_json, predict_plan
    from servesweep.spec.load import load_sweep
    from servesweep.spec.plan import build_plan, estimate_duration, format_plan
    from servesweep.store import open_store
    from servesweep.sweep.commands.run import store_path_for
    from servesweep.sweep.commands.status import known_trials
    from servesweep.sweep.core.earlier import earlier_sweeps
    from servesweep.sweep.core.predict_gate import setting_of

    loaded = load_sweep(sweep_file)
    the_plan = build_plan(loaded.spec)
    memory = MemoryModel.of_sweep(loaded.spec)
    planned = predict_plan(loaded.spec, the_plan, memory)
    path = store_path_for(loaded, store)
    history: dict[str, float] = {}
    known: dict[str, Any] = {}
    next_number = 1
    setting = setting_of(loaded.spec)
    configs = [p.config for p in planned]
    notes: list[str] = []
    if path.exists():
        with open_store(path, readonly=True) as db:
            history = db.phase_history(loaded.spec.name)
            known, next_number = known_trials(db, loaded.spec.name)
            current = db.latest_sweep(loaded.spec.name)
            past = earlier_sweeps(db, loaded.spec, current)
            this = current.id if current is not None else None
            perf = predict_configs(setting, configs, db, this, past.ids)
            notes = past.notes(perf[3])
    else:
        perf = predict_configs(setting, configs, None)
    setting, predictions, measured, earlier = perf
    if as_json:
        out = memory_json(planned)
        for entry, prediction in zip(out["trials"], predictions, strict=True):
            entry["predicted_performance"] = predicted_json(prediction)
        click.echo(json.dumps(out, indent=2))
        return
    estimate = estimate_duration(the_plan, history) if history else None
    note = f"from earlier sweeps in {path}" if history else None
    click.echo(format_plan(the_plan, estimate, note, known=known, next_number=next_number))
    click.echo("")
    click.echo(format_memory(planned, memory))
    click.echo("")
    ids = [p.id for p in planned]
    click.echo(format_predicted(ids, setting, predictions, measured, earlier, notes))


def _resolve_store(target: str | None) -> tuple[Path, str | None]:
    """``[FILE|DB]`` -> (database path, sweep name or None)."""
    from servesweep.spec.load import load_sweep
    from servesweep.sweep.commands.run import store_path_for

    if target is None:
        path = Path("servesweep.db")
        if not path.exists():
            raise ConfigError("no servesweep.db here; name a sweep file or a results database")
        return path, None
    candidate = Path(target)
    if candidate.suffix in (".yaml", ".yml"):
        loaded = load_sweep(candidate)
        return store_path_for(loaded), loaded.spec.name
    if not candidate.exists():
        raise ConfigError(f"{target}: no such sweep file or results database")
    return candidate, None


@cli.command(short_help="Where a sweep stands (also while it runs).")
@click.argument("target", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(target: str | None, as_json: bool) -> None:
    """Where a sweep stands (works while another process runs it).

    TARGET is a sweep file or a results database (default: servesweep.db here)."""
    from servesweep.sweep.commands.status import format_status, sweep_status

    path, name = _resolve_store(target)
    result = sweep_status(path, name)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(format_status(result))


# -- report, best, compare ------------------------------------------------------------


def _load_data(path: Path, sweep_id: int | None, name: str | None) -> Any:
    """The SweepData of sweep ``sweep_id`` (else the latest one, named ``name`` when
    given) in ``path``; a sweep that is not there is a usage error that lists those
    that are."""
    from servesweep.store import open_store

    with open_store(path, readonly=True) as store:
        sweeps = store.sweeps()
        known = [s for s in sweeps if (sweep_id is None or s.id == sweep_id)]
        known = [s for s in known if sweep_id is not None or name is None or s.name == name]
        if not known:
            what = f"no sweep {sweep_id}" if sweep_id is not None else "no sweep"
            what += f" named {name!r}" if name and sweep_id is None else ""
            there = ", ".join(f"{s.id} ({s.name})" for s in sweeps) or "none: run the sweep first"
            raise ConfigError(
                f"{what} in {path} (sweeps: {there})", key="--sweep" if sweep_id else None
            )
        return store.load_sweep_data(known[-1].id, with_samples=False)


FORMAT_ALIASES = {"md": "markdown"}


@cli.command(short_help="Render a sweep's results (table, CSV, JSON, HTML).")
@click.argument("target", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "markdown", "md", "csv", "json", "html"]),
    default="table",
    show_default=True,
    help="Output format (md is markdown).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file (html on a terminal, without --out: NAME-report.html here).",
)
@click.option("--sweep", "sweep_id", type=int, help="Sweep id in the database (default: latest).")
@click.option(
    "--columns",
    help="Columns of the table and markdown formats: params and metric names, comma-separated "
    "(default: as many as fit, by priority).",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Rewrite --out as the sweep advances, until it is finished; an HTML report reloads "
    "itself meanwhile.",
)
@click.option(
    "--interval",
    default="2s",
    show_default=True,
    help="With --watch: how often to look at the results database.",
)
def report(
    target: str | None,
    fmt: str,
    out: Path | None,
    sweep_id: int | None,
    columns: str | None,
    watch: bool,
    interval: str,
) -> None:
    """Render a sweep's results (finished or still running).

    TARGET is a sweep file or a results database (default: servesweep.db here)."""
    from servesweep.report import render

    fmt = FORMAT_ALIASES.get(fmt, fmt)
    chosen = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    path, name = _resolve_store(target)
    data = _load_data(path, sweep_id, name)
    if watch:
        _watch(path, data.sweep.id, fmt, out, interval, chosen)
        return
    console = _console()
    if out is None and fmt == "html" and sys.stdout.isatty():
        # a page of HTML is no terminal output: it goes to a file, and the line says where
        out = Path(re.sub(r"[^A-Za-z0-9._-]+", "_", data.sweep.name) + "-report.html")
    text = render(
        data,
        fmt,
        color=out is None and fmt == "table" and console.is_terminal and not console.no_color,
        width=console.width if out is None else 200,
        columns=chosen,
    )
    if out is not None:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write {out}: {exc.strerror}", key="--out") from exc
        click.echo(f"wrote {out.resolve()}", err=True)
    else:
        click.echo(text)


def _watch(
    path: Path, sweep_id: int, fmt: str, out: Path | None, interval: str, columns: Any
) -> None:
    """``report --watch``: rewrite ``out`` until the sweep is finished."""
    from servesweep.report import render
    from servesweep.report.html import DEFAULT_RELOAD_S
    from servesweep.report.watch import watch_report
    from servesweep.spec.schema import parse_duration

    if out is None:
        raise ConfigError("--watch rewrites a file: give --out PATH", key="--watch")
    try:
        seconds = parse_duration(interval)
    except ValueError as exc:
        raise ConfigError(str(exc), key="--interval") from None
    _install_signal_handlers()
    err = _console(stderr=True)

    def say(data: Any) -> None:
        done = sum(1 for t in data.trials if t.outcome.final)
        state = "finished" if data.sweep.finished_at else "running"
        err.print(
            f"wrote {out}: {done}/{len(data.trials)} trials done, sweep {state}", markup=False
        )

    watch_report(
        lambda: _load_data(path, sweep_id, None),
        lambda data, live: render(
            data, fmt, width=200, columns=columns, reload_s=DEFAULT_RELOAD_S if live else None
        ),
        out,
        interval_s=seconds,
        on_write=say,
    )


@cli.command(short_help="The best configuration and why the others lost.")
@click.argument("target", required=False)
@click.option(
    "--objective",
    "objectives",
    multiple=True,
    help="Metric to optimise, e.g. chat.c1.output_throughput or chat.c8.tpot_p99_ms:min. "
    "Repeat for several objectives: the Pareto set is shown.",
)
@click.option("--minimize", is_flag=True, help="Minimise an objective without :min/:max.")
@click.option(
    "--constraint",
    "constraints",
    multiple=True,
    help="e.g. 'chat.c1.ttft_p99_ms < 500' (repeatable; replaces the sweep file's).",
)
@click.option(
    "--include-unreliable",
    is_flag=True,
    default=None,
    help="Let levels the load generator could not time count (default: the sweep file's "
    "include_unreliable, else they are left out).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def best(
    target: str | None,
    objectives: tuple[str, ...],
    minimize: bool,
    constraints: tuple[str, ...],
    include_unreliable: bool | None,
    as_json: bool,
) -> None:
    """The best configuration under the objective and constraints, and why each other
    configuration lost. Exit 1 when none is feasible.

    TARGET is a sweep file or a results database (default: servesweep.db here)."""
    from servesweep.cli.schedule import schedule_of
    from servesweep.decide.best import find_best
    from servesweep.decide.refs import check_constraint, check_ref
    from servesweep.report import best_to_json, format_best
    from servesweep.report.schedule_view import format_schedule, schedule_to_json

    default = "min" if minimize else "max"
    parsed: list[tuple[str, str]] = []
    for text in objectives:
        if text.endswith((":min", ":max")):
            ref, _, direction = text.rpartition(":")
            parsed.append((ref, direction))
        else:
            parsed.append((text, default))
    path, name = _resolve_store(target)
    data = _load_data(path, None, name)
    # checked like the sweep file's own: a misspelt name is a usage error, not a
    # configuration that no trial satisfies
    for text, _ in parsed:
        check_ref(data, text, key="--objective")
    for text in constraints:
        check_constraint(data, text, key="--constraint")
    if len(parsed) > 1:
        result = find_best(
            data,
            None,
            default,
            constraints or tuple(data.constraints),
            objectives=parsed,
            include_unreliable=include_unreliable or None,
        )
    else:
        objective, direction = parsed[0] if parsed else (None, default)
        result = find_best(
            data,
            objective,
            direction,
            constraints or tuple(data.constraints),
            include_unreliable=include_unreliable or None,
        )
    schedule, launches = schedule_of(data, result, include_unreliable or None)
    if as_json:
        doc = best_to_json(result)
        doc["draft_schedule"] = schedule_to_json(schedule, launches)
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_best(result))
        if schedule is not None:
            click.echo(format_schedule(schedule, launches))
    if not result.feasible:
        raise _Exit(EXIT_FAILED)


@cli.command(short_help="Two sweeps or two configurations side by side.")
@click.argument("a")
@click.argument("b")
@click.option("--trial-a", type=int, help="A trial of A to compare (with --trial-b).")
@click.option("--trial-b", type=int, help="A trial of B to compare (with --trial-a).")
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    help="Show this metric (a name like ttft_p99_ms or a reference like chat.c8.ttft_p99_ms), "
    "changed or not; repeatable.",
)
@click.option(
    "--all", "show_all", is_flag=True, help="Every metric, not only changes beyond the noise."
)
def compare(
    a: str,
    b: str,
    trial_a: int | None,
    trial_b: int | None,
    metrics: tuple[str, ...],
    show_all: bool,
) -> None:
    """Two sweeps (or two configurations) side by side.

    A and B are sweep files or results databases; their configurations are matched by
    their params. With --trial-a and --trial-b: those two configurations (A and B may
    then be the same sweep). Shows the metrics that changed beyond the run-to-run noise,
    marked better or worse; --metric and --all show more."""
    from servesweep.report import compare as do_compare
    from servesweep.report import format_comparison

    datas = []
    for target in (a, b):
        path, name = _resolve_store(target)
        datas.append(_load_data(path, None, name))
    result = do_compare(datas[0], datas[1], trial_a=trial_a, trial_b=trial_b)
    click.echo(format_comparison(result, metrics=metrics, show_all=show_all))


# -- apply, wait-gpus, doctor ---------------------------------------------------------


@cli.command(short_help="Move the server to one configuration, leave it up.")
@click.argument("sweep_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--trial", "trial_id", type=int, help="Use the params of this trial.")
@click.option("--set", "sets", multiple=True, help="key=value param (repeatable).")
@click.option("--best", "use_best", is_flag=True, help="Use the best configuration of the sweep.")
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results database (default: the sweep file's store).",
)
def apply(
    sweep_file: Path,
    trial_id: int | None,
    sets: tuple[str, ...],
    use_best: bool,
    store: Path | None,
) -> None:
    """Move the server of SWEEP_FILE to one configuration safely and leave it running."""
    from servesweep.sweep.commands.apply import apply_config, parse_sets

    chosen = sum(1 for x in (trial_id is not None, bool(sets), use_best) if x)
    if chosen != 1:
        raise ConfigError("give exactly one of --trial ID, --set key=value..., --best")
    from servesweep.cli.display import ProgressDisplay

    _install_signal_handlers()
    warnings = ProgressDisplay(_console(), quiet=True, err_console=_console(stderr=True))
    result = apply_config(
        sweep_file,
        trial_id=trial_id,
        params=parse_sets(sets) if sets else None,
        best=use_best,
        store=store,
        observer=warnings,
    )
    click.echo(result.message)
    raise _Exit(EXIT_OK if result.ok else EXIT_FAILED)


@cli.command(short_help="Stop the servers a sweep left running.")
@click.argument("sweep_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results database (default: the sweep file's store).",
)
def stop(sweep_file: Path, store: Path | None) -> None:
    """Stop the servers of SWEEP_FILE's sweep that are left running on this machine.

    What `servesweep apply` or `run --keep-running` left running, or what a run that
    died left behind: only instances of this results database, never another sweep's.
    Refused while a run of this database is alive (stop that run with Ctrl-C). Exit 1
    when an instance could not be stopped."""
    from servesweep.sweep.commands.stop import stop_instances

    _install_signal_handlers()
    result = stop_instances(sweep_file, store=store)
    for line in result.lines:
        click.echo(line)
    raise _Exit(EXIT_OK if result.ok else EXIT_FAILED)


@cli.command("wait-gpus", short_help="Wait until GPUs are free (for shell scripts).")
@click.option("--gpus", required=True, help="GPU indexes: 0-7 or 0,1,2.")
@click.option("--tolerance", default="1GiB", show_default=True, help="Used memory allowed per GPU.")
@click.option(
    "--timeout", default="5m", show_default=True, help="Give up (exit 1) after this long."
)
@click.option(
    "--settle",
    default="0.2s",
    show_default=True,
    help="Memory must stay within the tolerance this long.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nvml", "fake"]),
    default="auto",
    show_default=True,
    help="How GPUs are probed (auto: fake GPUs when --fake-gpus or SERVESWEEP_FAKE_GPUS "
    "is set, else NVML).",
)
@click.option("--fake-gpus", type=click.Path(file_okay=False), help="Fake GPU directory.")
def wait_gpus(
    gpus: str, tolerance: str, timeout: str, settle: str, backend: str, fake_gpus: str | None
) -> None:
    """Wait until GPUs are free (the release gate for shell scripts)."""
    from servesweep.sweep.commands.wait_gpus import wait_gpus as do_wait

    ok, message = do_wait(gpus, tolerance, timeout, settle, backend, fake_gpus)
    click.echo(message, err=not ok)
    raise _Exit(EXIT_OK if ok else EXIT_FAILED)


@cli.command(short_help="Can the engine start? GPUs, port, unit, flags.")
@click.argument("sweep_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--backend",
    type=click.Choice(["auto", "nvml", "fake", "none"]),
    default="auto",
    show_default=True,
    help="How GPUs are probed (auto: the sweep file's gpu_backend).",
)
@click.option(
    "--fake-gpus",
    type=click.Path(file_okay=False),
    help="Fake GPU directory (default: the sweep file's fake_gpu_dir).",
)
def doctor(sweep_file: Path | None, as_json: bool, backend: str, fake_gpus: str | None) -> None:
    """GPUs, their holders, the port owner, the unit, and whether generation works.

    With SWEEP_FILE: the sweep's GPUs, port, unit and engine, and whether the engine can
    start at all (its program, its Python, the model path, the unit or image, the flags
    against the engine's own parser): each problem is one line on stderr, exit code 1.
    Without: the GPUs."""
    from servesweep.sweep.commands.doctor import doctor as do_doctor
    from servesweep.sweep.commands.doctor import format_doctor

    report_data = do_doctor(sweep_file, backend, fake_gpus)
    click.echo(
        json.dumps(report_data, indent=2, default=str) if as_json else format_doctor(report_data)
    )
    for warning in report_data.get("warnings", []):
        click.echo(f"doctor: warning: {warning}", err=True)
    for problem in report_data.get("problems", []):
        click.echo(f"doctor: {problem}", err=True)
    if report_data.get("problems"):
        raise _Exit(EXIT_FAILED)


# -- bench, sim -----------------------------------------------------------------------


@cli.command(short_help="Benchmark a running server without a sweep file.")
@click.option("--url", required=True, help="Base URL of an OpenAI-compatible server.")
@click.option("--model", help="Model name (default: ask /v1/models).")
@click.option("--concurrency", default="", help="Closed-loop levels, e.g. 1,4,16.")
@click.option("--rate", default="", help="Open-loop request rates (req/s), e.g. 2,5.")
@click.option("--requests", type=int, default=32, show_default=True, help="Requests per level.")
@click.option(
    "--duration",
    default=None,
    help="Bound each level by time too, e.g. 30s: at its end, requests still in flight after "
    "a short grace are cancelled and counted as timeouts.",
)
@click.option(
    "--request-timeout",
    default="600s",
    show_default=True,
    help="Longest a request may take before it counts as a timeout, e.g. 30s.",
)
@click.option("--warmup", type=int, default=0, show_default=True, help="Unmeasured requests.")
@click.option(
    "--dataset",
    default="builtin:chat",
    show_default=True,
    help="builtin:chat, builtin:coding, builtin:math, synthetic, or a JSONL/ShareGPT file.",
)
@click.option("--input-tokens", type=int, help="Prompt length for --dataset synthetic.")
@click.option(
    "--max-tokens", type=int, default=256, show_default=True, help="Tokens per completion."
)
@click.option(
    "--endpoint",
    type=click.Choice(["chat", "completions"]),
    default="chat",
    show_default=True,
    help="/v1/chat/completions or /v1/completions.",
)
@click.option("--workers", type=int, default=1, show_default=True, help="Generator processes.")
@click.option("--api-key-env", help="Environment variable holding the API key.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def bench(
    url: str,
    model: str | None,
    concurrency: str,
    rate: str,
    requests: int,
    duration: str | None,
    request_timeout: str,
    warmup: int,
    dataset: str,
    input_tokens: int | None,
    max_tokens: int,
    endpoint: str,
    workers: int,
    api_key_env: str | None,
    as_json: bool,
) -> None:
    """Benchmark an already-running server, without a sweep file."""
    from servesweep.bench.load import LoadOptions
    from servesweep.bench.standalone import (
        BenchServer,
        bench_workload,
        format_results,
        results_as_dicts,
        run_standalone,
    )
    from servesweep.spec.schema import parse_duration

    def numbers(text: str, kind: type[float] | type[int], flag: str) -> list[Any]:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(
                f"not a comma-separated list of numbers: {text!r}", key=flag
            ) from None

    levels = numbers(concurrency, int, "--concurrency")
    rates = numbers(rate, float, "--rate")
    if not levels and not rates:
        levels = [1]
    seconds = None
    if duration is not None:
        try:
            seconds = parse_duration(duration)
        except ValueError as exc:
            raise ConfigError(str(exc), key="--duration") from None
    try:
        timeout_s = parse_duration(request_timeout)
    except ValueError as exc:
        raise ConfigError(str(exc), key="--request-timeout") from None
    if timeout_s <= 0:
        raise ConfigError("must be more than 0 s", key="--request-timeout")
    server = BenchServer(url, model=model, api_key_env=api_key_env, timeout_s=timeout_s)
    server.api_key()  # a missing key is named before the workload's problems
    workload = bench_workload(
        concurrency=levels,
        rate=rates,
        requests=requests,
        duration=seconds,
        warmup=warmup,
        dataset=dataset,
        input_tokens=input_tokens,
        max_tokens=max_tokens,
        endpoint=endpoint,
    )
    _install_signal_handlers()
    results = run_standalone(server, workload, LoadOptions(workers=workers))
    if as_json:
        click.echo(json.dumps(results_as_dicts(results), indent=2, default=str))
    else:  # warnings and errors are the table's notes, each once
        _console().print(format_results(results))


@cli.command(
    short_help="Run the simulated inference engine.",
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],
    },
)
@click.pass_context
def sim(ctx: click.Context) -> None:
    """Run the simulated inference engine (see `servesweep sim --help`)."""
    from servesweep.sim import main as sim_main

    raise _Exit(sim_main(list(ctx.args), prog="servesweep sim"))


@cli.command(
    "fake-gpus",
    short_help="Create, show or hold fake GPUs for tests.",
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],
    },
)
@click.pass_context
def fake_gpus_cmd(ctx: click.Context) -> None:
    """Create, show or hold fake GPUs (see `servesweep fake-gpus --help`)."""
    from servesweep.fakegpu.__main__ import main as fake_main

    raise _Exit(fake_main(list(ctx.args), prog="servesweep fake-gpus"))


# -- the one place errors become exit codes -------------------------------------------


def main(argv: Sequence[str] | None = None) -> NoReturn:
    err = _console(stderr=True)
    try:
        cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="servesweep",
            standalone_mode=False,
        )
        code = EXIT_OK
    except _Exit as done:
        code = done.code
    except click.exceptions.Exit as done:
        code = done.exit_code
    except click.ClickException as exc:
        exc.show()
        code = EXIT_USAGE
    except click.exceptions.Abort:
        code = EXIT_INTERRUPTED
    except (Interrupted, KeyboardInterrupt) as exc:
        text = str(exc) or "SIGINT"
        err.print(
            f"servesweep: {text}"
            if text.startswith("interrupted")
            else f"servesweep: interrupted ({text})",
            markup=False,
        )
        code = EXIT_INTERRUPTED
    except (ConfigError, SandboxError) as exc:
        err.print(f"servesweep: {exc}", markup=False, highlight=False)
        code = EXIT_USAGE
    except ServesweepError as exc:
        err.print(f"servesweep: {exc}", markup=False, highlight=False)
        code = EXIT_FAILED
    except BrokenPipeError:
        code = EXIT_OK
    except Exception as exc:
        if os.environ.get("SERVESWEEP_DEBUG"):
            raise
        err.print(
            f"servesweep: internal error: {type(exc).__name__}: {exc} "
            "(a bug; rerun with SERVESWEEP_DEBUG=1 for the traceback and report it)",
            markup=False,
            highlight=False,
        )
        code = EXIT_INTERNAL
    sys.exit(code)


if __name__ == "__main__":
    main()
