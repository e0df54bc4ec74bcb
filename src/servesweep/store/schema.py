"""The SQLite schema of the results database and its migrations.

``SCHEMA_VERSION`` is stored in ``meta``; ``MIGRATIONS[n]`` upgrades a database
from version ``n`` to ``n + 1``. A database newer than this servesweep is refused
rather than guessed at.
"""

from __future__ import annotations

SCHEMA_VERSION = 6

SAMPLE_PART = 256 * 2**20
"""The largest part of a level's blob of samples, in bytes (table ``sample_columns``)."""

CREATE_V1 = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    spec_path TEXT NOT NULL,
    spec_text TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    servesweep_version TEXT NOT NULL,
    environment TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS sweeps_name ON sweeps(name);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY,
    sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
    seq INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    params TEXT NOT NULL,
    outcome TEXT NOT NULL DEFAULT 'pending',
    failure_class TEXT,
    evidence TEXT,
    phase TEXT,
    phase_started TEXT NOT NULL DEFAULT '{}',
    phase_seconds TEXT NOT NULL DEFAULT '{}',
    instance TEXT,
    instance_live INTEGER NOT NULL DEFAULT 0,
    log_path TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    finished_at REAL,
    in_plan INTEGER NOT NULL DEFAULT 1,
    adopted INTEGER NOT NULL DEFAULT 0,
    launch_command TEXT,
    UNIQUE (sweep_id, fingerprint)
);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY,
    trial_id INTEGER NOT NULL REFERENCES trials(id),
    attempt INTEGER NOT NULL,
    workload TEXT NOT NULL,
    level TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    info TEXT NOT NULL DEFAULT '{}',
    warnings TEXT NOT NULL DEFAULT '[]',
    started_at REAL NOT NULL,
    duration_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS results_trial ON results(trial_id);
CREATE TABLE IF NOT EXISTS samples (
    result_id INTEGER NOT NULL REFERENCES results(id),
    idx INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    error TEXT,
    scheduled_at REAL,
    sent_at REAL NOT NULL,
    first_token_at REAL,
    finished_at REAL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    reasoning_tokens INTEGER,
    chunk_gaps TEXT NOT NULL DEFAULT '[]',
    chunk_tokens TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS samples_result ON samples(result_id);
CREATE TABLE IF NOT EXISTS eval_results (
    result_id INTEGER NOT NULL REFERENCES results(id),
    task_id TEXT NOT NULL,
    sample INTEGER NOT NULL,
    status TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    seconds REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS eval_results_result ON eval_results(result_id);
CREATE TABLE IF NOT EXISTS telemetry (
    trial_id INTEGER NOT NULL REFERENCES trials(id),
    t REAL NOT NULL,
    gpu INTEGER NOT NULL,
    used_bytes INTEGER NOT NULL,
    utilization_pct REAL,
    power_w REAL
);
CREATE INDEX IF NOT EXISTS telemetry_trial ON telemetry(trial_id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
    trial_id INTEGER,
    t REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL DEFAULT '{}'
);
"""

# version n -> n + 1; each entry is a script run in one transaction.
MIGRATIONS: dict[int, str] = {
    # where a trial ran: the machine (hostname, cluster node id), the slot (lane) and
    # the GPU indexes it was given; telemetry names its machine too
    1: """
ALTER TABLE trials ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE trials ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
ALTER TABLE trials ADD COLUMN slot INTEGER;
ALTER TABLE trials ADD COLUMN gpus TEXT NOT NULL DEFAULT '[]';
ALTER TABLE telemetry ADD COLUMN node TEXT NOT NULL DEFAULT '';
""",
    # the confidence interval of each key metric of a level ({metric: [lo, hi]}) and
    # its confidence; a level stored before has none (reports compute them from the
    # level's stored requests); which launch of the server measured the level
    2: """
ALTER TABLE results ADD COLUMN intervals TEXT NOT NULL DEFAULT '{}';
ALTER TABLE results ADD COLUMN confidence REAL;
ALTER TABLE results ADD COLUMN launch INTEGER NOT NULL DEFAULT 0;
""",
    # a level the load generator could not time: why (NULL: reliable)
    3: """
ALTER TABLE results ADD COLUMN unreliable TEXT;
""",
    # a level of the screening pass (short levels, stored apart from the full
    # measurement): 1; 0 for every level stored before
    4: """
ALTER TABLE results ADD COLUMN screening INTEGER NOT NULL DEFAULT 0;
""",
    # a level's requests as one blob of columns (servesweep.samples.SampleColumns,
    # ``layout`` its version) instead of a row per request, in parts (``part`` 0, 1...)
    # of at most SAMPLE_PART bytes each (SQLite refuses a value over 1 GB); the rows
    # of the levels stored before stay where they are and are read as they were
    5: """
CREATE TABLE IF NOT EXISTS sample_columns (
    result_id INTEGER NOT NULL REFERENCES results(id),
    part INTEGER NOT NULL,
    layout INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (result_id, part)
);
""",
}
