"""The SQLite results database (stdlib ``sqlite3``, WAL).

Every method that changes state commits before it returns, so a servesweep
killed at any moment leaves a consistent database that the next run resumes.
Readers (``servesweep status``/``report``) can open the same file while a sweep
runs.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import servesweep.store.schema as schema
from servesweep.errors import ServesweepError, StoreError
from servesweep.models import (
    EvalTaskResult,
    Evidence,
    FailureClass,
    InstanceRecord,
    LevelResult,
    Outcome,
    Phase,
    RequestSample,
    ServerConfig,
)
from servesweep.records import ReopenedSkip, SweepData, SweepRecord, TelemetryPoint, TrialRecord
from servesweep.samples import SampleColumns, columns_of
from servesweep.store.schema import CREATE_V1, MIGRATIONS, SCHEMA_VERSION

__all__ = ["Store", "open_store"]

_TRIAL_COLUMNS = (
    "id, sweep_id, seq, fingerprint, params, outcome, failure_class, evidence, phase, "
    "phase_started, phase_seconds, instance, log_path, attempts, started_at, finished_at, "
    "in_plan, adopted, launch_command, node, node_id, slot, gpus, "
    # the trial's number within its sweep (what people read): its rank by id there
    "(SELECT COUNT(*) FROM trials AS o WHERE o.sweep_id = trials.sweep_id "
    "AND o.id <= trials.id) AS sweep_number"
)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def open_store(path: str | Path, *, readonly: bool = False) -> Store:
    """Open (and create or migrate) the results database at ``path``."""
    return Store(Path(path), readonly=readonly)


class Store:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self._tables: dict[str, bool] = {}
        try:
            if readonly:
                if not path.exists():
                    raise StoreError(f"no results database at {path}")
                self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(path, timeout=30)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys=ON")
            if not readonly:
                self._migrate()
            else:
                self._check_version()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open results database {path}: {exc}") from exc

    # -- plumbing -------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            with self._db:
                yield self._db
        except sqlite3.Error as exc:
            raise StoreError(f"results database {self.path}: {exc}") from exc

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return list(self._db.execute(sql, args))
        except sqlite3.Error as exc:
            raise StoreError(f"results database {self.path}: {exc}") from exc

    def _version(self) -> int:
        row = self._db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if row is None:
            return 0
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _check_version(self) -> None:
        version = self._version()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer servesweep (schema {version}, "
                f"this one knows {SCHEMA_VERSION}); upgrade servesweep"
            )

    def _migrate(self) -> None:
        self._check_version()
        version = self._version()
        with self._db:
            if version == 0:
                self._db.executescript(CREATE_V1)
                self._db.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', '1')"
                )
                version = 1
            while version < SCHEMA_VERSION:
                self._db.executescript(MIGRATIONS[version])
                version += 1
                self._db.execute(
                    "UPDATE meta SET value=? WHERE key='schema_version'", (str(version),)
                )

    @property
    def store_id(self) -> str:
        """This database's own id (made when it was created): every instance a run of
        it starts carries it, so runs of other databases never take it for theirs."""
        rows = self._query("SELECT value FROM meta WHERE key='store_id'")
        if rows:
            return str(rows[0][0])
        new = uuid.uuid4().hex[:16]
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('store_id', ?)", (new,))
        return str(self._query("SELECT value FROM meta WHERE key='store_id'")[0][0])

    # -- sweeps ---------------------------------------------------------------------

    @staticmethod
    def _sweep(row: sqlite3.Row) -> SweepRecord:
        return SweepRecord(
            id=row["id"],
            name=row["name"],
            spec_path=row["spec_path"],
            spec_text=row["spec_text"],
            spec_hash=row["spec_hash"],
            created_at=row["created_at"],
            servesweep_version=row["servesweep_version"],
            environment=json.loads(row["environment"]),
            finished_at=row["finished_at"],
        )

    def create_sweep(
        self, name: str, spec_path: str, spec_text: str, spec_hash: str, version: str
    ) -> SweepRecord:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO sweeps(name, spec_path, spec_text, spec_hash, created_at, "
                "servesweep_version) VALUES (?, ?, ?, ?, ?, ?)",
                (name, spec_path, spec_text, spec_hash, time.time(), version),
            )
            sweep_id = cur.lastrowid
        assert sweep_id is not None
        return self.sweep(sweep_id)

    def sweep(self, sweep_id: int) -> SweepRecord:
        rows = self._query("SELECT * FROM sweeps WHERE id=?", (sweep_id,))
        if not rows:
            raise StoreError(f"no sweep with id {sweep_id} in {self.path}")
        return self._sweep(rows[0])

    def latest_sweep(self, name: str | None = None) -> SweepRecord | None:
        if name is None:
            rows = self._query("SELECT * FROM sweeps ORDER BY id DESC LIMIT 1")
        else:
            rows = self._query(
                "SELECT * FROM sweeps WHERE name=? ORDER BY id DESC LIMIT 1", (name,)
            )
        return self._sweep(rows[0]) if rows else None

    def sweeps(self) -> list[SweepRecord]:
        return [self._sweep(r) for r in self._query("SELECT * FROM sweeps ORDER BY id")]

    def update_sweep_spec(
        self, sweep_id: int, spec_path: str, spec_text: str, spec_hash: str
    ) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE sweeps SET spec_path=?, spec_text=?, spec_hash=?, finished_at=NULL "
                "WHERE id=?",
                (spec_path, spec_text, spec_hash, sweep_id),
            )

    def set_environment(self, sweep_id: int, environment: Mapping[str, Any]) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE sweeps SET environment=? WHERE id=?", (_dumps(dict(environment)), sweep_id)
            )

    def finish_sweep(self, sweep_id: int, at: float | None = None) -> None:
        with self._tx() as db:
            db.execute("UPDATE sweeps SET finished_at=? WHERE id=?", (at or time.time(), sweep_id))

    # -- trials ---------------------------------------------------------------------

    @staticmethod
    def _trial(row: sqlite3.Row) -> TrialRecord:
        evidence = json.loads(row["evidence"]) if row["evidence"] else None
        instance = json.loads(row["instance"]) if row["instance"] else None
        return TrialRecord(
            id=row["id"],
            sweep_id=row["sweep_id"],
            seq=row["seq"],
            fingerprint=row["fingerprint"],
            params=json.loads(row["params"]),
            outcome=Outcome(row["outcome"]),
            failure_class=FailureClass(row["failure_class"]) if row["failure_class"] else None,
            evidence=Evidence.from_dict(evidence) if evidence else None,
            phase=Phase(row["phase"]) if row["phase"] else None,
            phase_started=json.loads(row["phase_started"]),
            phase_seconds=json.loads(row["phase_seconds"]),
            instance=InstanceRecord.from_dict(instance) if instance else None,
            log_path=row["log_path"],
            attempts=row["attempts"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            in_plan=bool(row["in_plan"]),
            adopted=bool(row["adopted"]),
            launch_command=row["launch_command"],
            node=row["node"],
            node_id=row["node_id"],
            slot=row["slot"],
            gpus=tuple(json.loads(row["gpus"])),
            sweep_number=row["sweep_number"],
        )

    def sync_trials(self, sweep_id: int, configs: Sequence[ServerConfig]) -> list[TrialRecord]:
        """Make the stored trials match the plan: add new points, renumber, and mark
        points that the sweep file no longer has as out of plan (history kept)."""
        with self._tx() as db:
            db.execute("UPDATE trials SET in_plan=0 WHERE sweep_id=?", (sweep_id,))
            for seq, config in enumerate(configs):
                db.execute(
                    "INSERT INTO trials(sweep_id, seq, fingerprint, params) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(sweep_id, fingerprint) DO UPDATE SET seq=excluded.seq, "
                    "in_plan=1",
                    (sweep_id, seq, config.fingerprint, _dumps(dict(config.params))),
                )
        return self.trials(sweep_id, in_plan_only=True)

    def ensure_trial(
        self, sweep_id: int, config: ServerConfig, *, in_plan: bool = False
    ) -> TrialRecord:
        """The trial of this config, added (last in order) when the sweep never had it:
        out of plan (``servesweep apply``), or in plan (a search's proposal)."""
        with self._tx() as db:
            seq = db.execute(
                "SELECT COALESCE(MAX(seq), -1) + 1 FROM trials WHERE sweep_id=?", (sweep_id,)
            ).fetchone()[0]
            db.execute(
                "INSERT INTO trials(sweep_id, seq, fingerprint, params, in_plan) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(sweep_id, fingerprint) DO UPDATE SET "
                "in_plan=MAX(in_plan, excluded.in_plan)",
                (sweep_id, seq, config.fingerprint, _dumps(dict(config.params)), int(in_plan)),
            )
        rows = self._query(
            f"SELECT {_TRIAL_COLUMNS} FROM trials WHERE sweep_id=? AND fingerprint=?",
            (sweep_id, config.fingerprint),
        )
        return self._trial(rows[0])

    def trials(self, sweep_id: int, *, in_plan_only: bool = False) -> list[TrialRecord]:
        sql = f"SELECT {_TRIAL_COLUMNS} FROM trials WHERE sweep_id=?"
        if in_plan_only:
            sql += " AND in_plan=1"
        return [
            self._trial(r) for r in self._query(sql + " ORDER BY in_plan DESC, seq", (sweep_id,))
        ]

    def trial(self, trial_id: int) -> TrialRecord:
        rows = self._query(f"SELECT {_TRIAL_COLUMNS} FROM trials WHERE id=?", (trial_id,))
        if not rows:
            raise StoreError(f"no trial with id {trial_id} in {self.path}")
        return self._trial(rows[0])

    def begin_attempt(
        self,
        trial_id: int,
        at: float,
        log_path: str | None,
        *,
        node: str = "",
        node_id: str = "",
        slot: int | None = None,
        gpus: Sequence[int] = (),
    ) -> None:
        """A new attempt of a trial starts, on ``node``'s ``slot`` with ``gpus``."""
        with self._tx() as db:
            db.execute(
                "UPDATE trials SET outcome='running', attempts=attempts+1, failure_class=NULL, "
                "evidence=NULL, phase=NULL, phase_started='{}', phase_seconds='{}', "
                "started_at=?, finished_at=NULL, adopted=0, log_path=?, node=?, node_id=?, "
                "slot=?, gpus=? WHERE id=?",
                (at, log_path, node, node_id, slot, _dumps(list(gpus)), trial_id),
            )

    def enter_phase(
        self, trial_id: int, phase: Phase, at: float, previous_seconds: float | None = None
    ) -> None:
        """Record that a trial entered ``phase`` at ``at``, and how long the phase it
        left lasted, ``previous_seconds``, as its slot measured it (None: it left none).
        The store keeps the slot's figure; it does not time phases itself."""
        trial = self.trial(trial_id)
        started = dict(trial.phase_started)
        seconds = dict(trial.phase_seconds)
        if trial.phase is not None and previous_seconds is not None:
            # a phase entered again (a configuration measured in several launches) adds up
            seconds[trial.phase.value] = seconds.get(trial.phase.value, 0.0) + max(
                0.0, previous_seconds
            )
        started[phase.value] = at
        with self._tx() as db:
            db.execute(
                "UPDATE trials SET phase=?, phase_started=?, phase_seconds=? WHERE id=?",
                (phase.value, _dumps(started), _dumps(seconds), trial_id),
            )

    def set_phase_seconds(self, trial_id: int, phase: Phase, seconds: float) -> None:
        """Override a phase's measured duration (e.g. ``load`` split out of ``ready``)."""
        trial = self.trial(trial_id)
        values = dict(trial.phase_seconds)
        values[phase.value] = seconds
        with self._tx() as db:
            db.execute("UPDATE trials SET phase_seconds=? WHERE id=?", (_dumps(values), trial_id))

    def set_instance(
        self,
        trial_id: int,
        instance: InstanceRecord | None,
        *,
        live: bool = True,
        launch_command: str | None = None,
        adopted: bool = False,
    ) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE trials SET instance=?, instance_live=?, adopted=?, "
                "launch_command=COALESCE(?, launch_command) WHERE id=?",
                (
                    _dumps(instance.to_dict()) if instance else None,
                    1 if (instance and live) else 0,
                    1 if adopted else 0,
                    launch_command,
                    trial_id,
                ),
            )

    def mark_instance_gone(self, trial_id: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE trials SET instance_live=0 WHERE id=?", (trial_id,))

    def live_instances(self, sweep_id: int | None = None) -> list[TrialRecord]:
        """Trials whose instance may still be running (recorded and not yet stopped)."""
        sql = f"SELECT {_TRIAL_COLUMNS} FROM trials WHERE instance_live=1"
        args: tuple[Any, ...] = ()
        if sweep_id is not None:
            sql += " AND sweep_id=?"
            args = (sweep_id,)
        return [self._trial(r) for r in self._query(sql + " ORDER BY id", args)]

    def finish_trial(
        self,
        trial_id: int,
        outcome: Outcome,
        at: float,
        *,
        failure_class: FailureClass | None = None,
        evidence: Evidence | None = None,
        last_phase_seconds: float | None = None,
    ) -> None:
        """A trial ended at ``at``; ``last_phase_seconds``: how long its last phase
        lasted, as its slot measured it (None: the trial was ended without its slot, a
        stopped sweep or a lost node, and the phase lasted until ``at``)."""
        trial = self.trial(trial_id)
        seconds = _last_phase_added(trial, at, last_phase_seconds)
        if outcome is Outcome.OK:
            last_phase: str | None = Phase.DONE.value
        else:
            last_phase = trial.phase.value if trial.phase else None
        with self._tx() as db:
            db.execute(
                "UPDATE trials SET outcome=?, failure_class=?, evidence=?, phase_seconds=?, "
                "finished_at=?, phase=? WHERE id=?",
                (
                    outcome.value,
                    failure_class.value if failure_class else None,
                    _dumps(evidence.to_dict()) if evidence else None,
                    _dumps(seconds),
                    at,
                    last_phase,
                    trial_id,
                ),
            )

    def finish_relaunch(
        self, trial_id: int, seconds: float, at: float, last_phase_seconds: float | None = None
    ) -> None:
        """More launches of a finished trial (the confirm phase) ended: their phases add
        up (the last one ``last_phase_seconds`` long, as in :meth:`finish_trial`), its
        outcome stays, and its end moves by their ``seconds`` (so wall time x GPUs, its
        GPU-hours, counts them and not the time between)."""
        trial = self.trial(trial_id)
        phases = _last_phase_added(trial, at, last_phase_seconds)
        end = (trial.finished_at or at) + max(0.0, seconds)
        with self._tx() as db:
            db.execute(
                "UPDATE trials SET phase_seconds=?, finished_at=?, phase=? WHERE id=?",
                (_dumps(phases), end, Phase.DONE.value, trial_id),
            )

    def reset_trial(self, trial_id: int) -> None:
        """Make a finished trial pending again (``--retry-failed``)."""
        with self._tx() as db:
            db.execute(
                "UPDATE trials SET outcome='pending', failure_class=NULL, evidence=NULL WHERE id=?",
                (trial_id,),
            )

    # -- results --------------------------------------------------------------------

    def add_result(self, trial_id: int, result: LevelResult) -> int:
        trial = self.trial(trial_id)
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO results(trial_id, attempt, workload, level, repeat, metrics, info, "
                "warnings, started_at, duration_s, intervals, confidence, launch, unreliable, "
                "screening) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    trial_id,
                    trial.attempts,
                    result.workload,
                    result.level,
                    result.repeat,
                    _dumps(dict(result.metrics)),
                    _dumps(dict(result.info)),
                    _dumps(list(result.warnings)),
                    result.started_at,
                    result.duration_s,
                    _dumps({k: list(v) for k, v in result.intervals.items()}),
                    result.confidence,
                    result.launch,
                    result.unreliable,
                    1 if result.screening else 0,
                ),
            )
            result_id = cur.lastrowid
            assert result_id is not None
            if result.samples:
                blob = memoryview(columns_of(result.samples).to_bytes())
                db.executemany(
                    "INSERT INTO sample_columns(result_id, part, layout, data) VALUES (?, ?, ?, ?)",
                    [
                        (result_id, k, SampleColumns.FORMAT, blob[at : at + schema.SAMPLE_PART])
                        for k, at in enumerate(range(0, len(blob), schema.SAMPLE_PART))
                    ],
                )
            db.executemany(
                "INSERT INTO eval_results(result_id, task_id, sample, status, message, seconds) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (result_id, e.task_id, e.sample, e.status, e.message, e.seconds)
                    for e in result.eval_results
                ],
            )
        return result_id

    def results(
        self, trial_id: int, *, with_samples: bool = True, screening: bool = False
    ) -> list[LevelResult]:
        """The level results of a trial's latest attempt: its full measurement, or with
        ``screening`` the levels of its screening pass (never mixed)."""
        rows = self._query(
            "SELECT * FROM results WHERE trial_id=? AND attempt=(SELECT attempts FROM trials "
            "WHERE id=?) ORDER BY id",
            (trial_id, trial_id),
        )
        return [
            self._result(row, with_samples)
            for row in rows
            if bool(_column(row, "screening", 0)) == screening
        ]

    def _samples(self, result_id: int) -> Sequence[RequestSample]:
        """A level's requests: its blob of columns, or the rows of a level stored before
        there were columns (schema 5 and older)."""
        if self._has_table("sample_columns"):
            parts = self._query(
                "SELECT layout, data FROM sample_columns WHERE result_id=? ORDER BY part",
                (result_id,),
            )
            if parts:
                try:
                    data = b"".join(p["data"] for p in parts)
                    return SampleColumns.from_bytes(data, parts[0]["layout"])
                except ValueError as exc:
                    raise StoreError(
                        f"results database {self.path}: the requests of result {result_id} "
                        f"cannot be read ({exc})"
                    ) from exc
        return tuple(
            RequestSample(
                index=s["idx"],
                ok=bool(s["ok"]),
                error=s["error"],
                scheduled_at=s["scheduled_at"],
                sent_at=s["sent_at"],
                first_token_at=s["first_token_at"],
                finished_at=s["finished_at"],
                prompt_tokens=s["prompt_tokens"],
                completion_tokens=s["completion_tokens"],
                reasoning_tokens=s["reasoning_tokens"],
                chunk_gaps=tuple(json.loads(s["chunk_gaps"])),
                chunk_tokens=tuple(json.loads(s["chunk_tokens"])),
            )
            for s in self._query(
                "SELECT * FROM samples WHERE result_id=? ORDER BY idx", (result_id,)
            )
        )

    def _has_table(self, name: str) -> bool:
        """Whether the database has table ``name`` (a read-only look at an older one
        may not)."""
        found = self._tables.get(name)
        if found is None:
            found = bool(
                self._query("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,))
            )
            self._tables[name] = found
        return found

    def _result(self, row: sqlite3.Row, with_samples: bool) -> LevelResult:
        samples = self._samples(row["id"]) if with_samples else ()
        evals = tuple(
            EvalTaskResult(
                task_id=e["task_id"],
                sample=e["sample"],
                status=e["status"],
                message=e["message"],
                seconds=e["seconds"],
            )
            for e in self._query(
                "SELECT * FROM eval_results WHERE result_id=? ORDER BY rowid", (row["id"],)
            )
        )
        return LevelResult(
            workload=row["workload"],
            level=row["level"],
            repeat=row["repeat"],
            metrics=json.loads(row["metrics"]),
            samples=samples,
            warnings=tuple(json.loads(row["warnings"])),
            info=json.loads(row["info"]),
            started_at=row["started_at"],
            duration_s=row["duration_s"],
            eval_results=evals,
            # (a read-only look at an older database has none of the newer columns)
            intervals={
                k: (float(v[0]), float(v[1]))
                for k, v in json.loads(_column(row, "intervals", "{}")).items()
            },
            confidence=_column(row, "confidence", None),
            launch=_column(row, "launch", 0),
            unreliable=_column(row, "unreliable", None),
            screening=bool(_column(row, "screening", 0)),
        )

    def add_telemetry(self, points: Iterable[TelemetryPoint]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO telemetry(trial_id, t, gpu, used_bytes, utilization_pct, power_w, "
                "node) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (p.trial_id, p.t, p.gpu, p.used_bytes, p.utilization_pct, p.power_w, p.node)
                    for p in points
                ],
            )

    def telemetry(self, sweep_id: int) -> list[TelemetryPoint]:
        rows = self._query(
            "SELECT telemetry.* FROM telemetry JOIN trials ON trials.id=telemetry.trial_id "
            "WHERE trials.sweep_id=? ORDER BY t",
            (sweep_id,),
        )
        return [
            TelemetryPoint(
                trial_id=r["trial_id"],
                t=r["t"],
                gpu=r["gpu"],
                used_bytes=r["used_bytes"],
                utilization_pct=r["utilization_pct"],
                power_w=r["power_w"],
                node=r["node"],
            )
            for r in rows
        ]

    def add_event(
        self, sweep_id: int, kind: str, data: Mapping[str, Any], trial_id: int | None = None
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO events(sweep_id, trial_id, t, kind, data) VALUES (?, ?, ?, ?, ?)",
                (sweep_id, trial_id, time.time(), kind, _dumps(dict(data))),
            )

    def events(self, sweep_id: int, kind: str | None = None) -> list[dict[str, Any]]:
        """Lifecycle facts kept as evidence (stops, releases, cleaned orphans), in order."""
        rows = self._query(
            "SELECT trial_id, t, kind, data FROM events WHERE sweep_id=? AND (? IS NULL OR kind=?) "
            "ORDER BY id",
            (sweep_id, kind, kind),
        )
        return [
            {"trial": r["trial_id"], "t": r["t"], "kind": r["kind"], **json.loads(r["data"])}
            for r in rows
        ]

    # -- questions ------------------------------------------------------------------

    def phase_history(self, name: str, *, exclude_sweep: int | None = None) -> dict[str, float]:
        """Mean seconds per phase over ok trials of earlier sweeps with this name
        (and of the current one), for duration estimates."""
        rows = self._query(
            "SELECT trials.phase_seconds FROM trials JOIN sweeps ON sweeps.id=trials.sweep_id "
            "WHERE sweeps.name=? AND trials.outcome='ok' AND (? IS NULL OR sweeps.id != ?)",
            (name, exclude_sweep, exclude_sweep),
        )
        values: dict[str, list[float]] = {}
        for row in rows:
            for phase, seconds in json.loads(row["phase_seconds"]).items():
                values.setdefault(phase, []).append(float(seconds))
        return {phase: statistics.fmean(v) for phase, v in values.items() if v}

    def load_sweep_data(
        self,
        sweep_id: int | None = None,
        name: str | None = None,
        *,
        with_samples: bool = True,
        with_telemetry: bool = True,
    ) -> SweepData:
        """Everything a report needs about one sweep (latest one when none is named);
        without the requests' samples or the GPU telemetry when the caller needs only
        the levels (a decision taken while the sweep runs: telemetry grows with it)."""
        if sweep_id is not None:
            sweep = self.sweep(sweep_id)
        else:
            found = self.latest_sweep(name)
            if found is None:
                what = f"named {name!r} " if name else ""
                raise StoreError(f"no sweep {what}in {self.path}")
            sweep = found
        trials = self.trials(sweep.id)
        results = {t.id: tuple(self.results(t.id, with_samples=with_samples)) for t in trials}
        screening = {t.id: tuple(self.results(t.id, with_samples=False, screening=True))
                     for t in trials}  # fmt: skip
        screening = {k: v for k, v in screening.items() if v}
        objective: dict[str, Any] | None = None
        constraints: tuple[str, ...] = ()
        include_unreliable = False
        try:
            from servesweep.spec.load import load_sweep_text

            spec = load_sweep_text(sweep.spec_text, sweep.spec_path).spec
            if spec.objectives:
                objective = spec.objectives[0].model_dump(exclude_none=True)
            constraints = tuple(spec.constraints)
            include_unreliable = spec.include_unreliable
        except (ImportError, ServesweepError):
            pass  # an old or hand-edited sweep file must not block a report
        return SweepData(
            sweep=sweep,
            trials=tuple(trials),
            results=results,
            telemetry=tuple(self.telemetry(sweep.id)) if with_telemetry else (),
            objective=objective,
            constraints=constraints,
            include_unreliable=include_unreliable,
            memory={
                e["trial"]: {"predicted": e.get("predicted", {}), "measured": e.get("measured", {})}
                for e in self.events(sweep.id, "memory")
                if e["trial"] is not None
            },
            performance={
                e["trial"]: e
                for e in self.events(sweep.id, "performance")
                if e["trial"] is not None
            },
            confirm=tuple(self.events(sweep.id, "confirm")),
            screening=screening,
            screened=tuple(self.events(sweep.id, "screening")),
            mismatches=tuple(self.events(sweep.id, "config_mismatch")),
            reopened=ReopenedSkip.by_trial(self.events(sweep.id, ReopenedSkip.kind)),
        )


def _column(row: sqlite3.Row, name: str, default: Any) -> Any:
    """A row's column, or ``default`` where an older database (opened read-only, so
    not upgraded) has no such column."""
    return row[name] if name in row.keys() else default  # noqa: SIM118


def _last_phase_added(trial: TrialRecord, at: float, measured: float | None) -> dict[str, float]:
    """The trial's phase durations with its last phase's added: ``measured`` by its
    slot, or (None) the time from its start to ``at``, where no slot ended it."""
    seconds = dict(trial.phase_seconds)
    if trial.phase is None or trial.phase.value not in trial.phase_started:
        return seconds
    if measured is None:
        measured = at - trial.phase_started[trial.phase.value]
    seconds[trial.phase.value] = seconds.get(trial.phase.value, 0.0) + max(0.0, measured)
    return seconds
