"""A run holds its ports and GPUs for its whole life: a second run that needs them is
refused before it starts anything (one line naming the holder) or, with ``--wait``,
waits; a SIGKILLed run's lease is free at once; the same environment failure twice
in a row stops the sweep; the quickstart says what holds its port and how to run on
another."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml
from tests.integration.sweep_helpers import (
    SERVESWEEP,
    background_run,
    kill_tagged,
    report_json,
    run_cli,
    tagged_processes,
    wait_for_event,
    write_sweep,
)

from servesweep.servers.leases import Holder, Lease, gpu_resources, port_resource
from servesweep.sim.testing import free_port

_SHORT = [{"name": "chat", "concurrency": [1], "requests": 6, "max_tokens": 8, "ignore_eos": True}]
_REPO = Path(__file__).resolve().parents[2]


def _twins(tmp_path: Path, port: int) -> tuple[Path, Path]:
    """One sweep file in two folders (two results databases, two sets of fake GPUs),
    on the same port."""
    files = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        files.append(
            write_sweep(
                folder,
                name="twin",
                grid={"budget": [2]},
                workloads=_SHORT,
                server_extra={"port": port},
            )
        )
    return files[0], files[1]


def test_a_second_run_on_a_leased_port_exits_1_with_one_line_or_waits(tmp_path: Path) -> None:
    first, second = _twins(tmp_path, free_port())
    events_a, events_c = tmp_path / "a" / "events.jsonl", tmp_path / "b" / "events.jsonl"
    try:
        with background_run(first, events=events_a) as proc:
            wait_for_event(events_a, lambda e: e["event"] == "phase" and e["phase"] == "bench")
            # the first run stands still (its process, and so its lease, stays alive)
            # while the second one tries
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                later = run_cli("run", str(second), "--quiet", timeout=120)
                assert later.returncode == 1, later.stdout + later.stderr
                lines = later.stderr.strip().splitlines()
                assert len(lines) == 1, later.stderr
                line = lines[0]
                assert "is held by sweep 'twin'" in line, line
                assert str(tmp_path / "a" / "servesweep.db") in line, line
                assert f"servesweep pid {proc.pid}" in line, line
                assert "--wait" in line and "--port" in line, line
                # refused before it started anything: no trial of its own ran
                assert not (tmp_path / "b" / "servesweep.db").exists() or all(
                    t["outcome"] == "pending" for t in report_json(second)["trials"]
                )
                assert not tagged_processes("twin", tmp_path / "b")

                waiting = subprocess.Popen(
                    [
                        *SERVESWEEP,
                        "run",
                        str(second),
                        "--quiet",
                        "--wait",
                        "--events",
                        str(events_c),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "NO_COLOR": "1"},
                )
                try:
                    wait_for_event(
                        events_c,
                        lambda e: e["event"] == "warning" and "waiting for port" in e["message"],
                        timeout=120,
                    )
                finally:
                    os.kill(proc.pid, signal.SIGCONT)
                try:
                    out_c, err_c = waiting.communicate(timeout=240)
                finally:
                    if waiting.poll() is None:
                        waiting.kill()
                        waiting.communicate(timeout=30)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
            out_a, err_a = proc.communicate(timeout=240)
            assert proc.returncode == 0, out_a + err_a
        assert waiting.returncode == 0, out_c + err_c
        assert err_c.count("waiting for port") == 1, err_c  # one status line, not a stream
        assert [t["outcome"] for t in report_json(second)["trials"]] == ["ok"]
        # the waiting run started its first instance only after the first run had ended
        ended = wait_for_event(events_a, lambda e: e["event"] == "sweep_finished")
        started = wait_for_event(events_c, lambda e: e["event"] == "trial_started")
        assert started["t"] >= ended["t"], (started, ended)
    finally:
        kill_tagged("twin", tmp_path)


def test_a_sigkilled_runs_leases_are_free_at_once(tmp_path: Path) -> None:
    port = free_port()
    sweep = write_sweep(tmp_path, name="leasekill", workloads=_SHORT, server_extra={"port": port})
    events = tmp_path / "events.jsonl"
    wanted = [port_resource(port), *gpu_resources([0, 1], str(tmp_path / "gpus"))]
    probe = Lease(Holder(pid=os.getpid(), sweep="probe"))
    try:
        with background_run(sweep, events=events) as proc:
            wait_for_event(events, lambda e: e["event"] == "trial_started")
            busy = probe.take(wanted)
            assert busy is not None and busy.holder.pid == proc.pid, busy
            assert busy.holder.sweep == "leasekill", busy
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            # no wait, no clean-up: the locks died with the process
            assert probe.take(wanted) is None
            probe.release()
        # and the killed run continues on a rerun, which takes them again
        done = run_cli("run", str(sweep), "--quiet", timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        probe.release()
        kill_tagged("leasekill", tmp_path)


def test_the_same_environment_failure_twice_in_a_row_stops_the_sweep(tmp_path: Path) -> None:
    sweep = write_sweep(
        tmp_path,
        name="envstop",
        grid={"budget": [1, 2, 3, 4, 5]},
        workloads=_SHORT,
        server_extra={"timeouts": {"stop": "5s", "release": "1s", "ready": "30s"}},
    )
    events = tmp_path / "events.jsonl"
    holder: subprocess.Popen[bytes] | None = None
    try:
        with background_run(sweep, events=events) as proc:
            # a program outside the sweep takes GPU memory after the baseline was taken:
            # every trial from then on finds it there
            wait_for_event(events, lambda e: e["event"] == "baseline")
            holder = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "servesweep.fakegpu",
                    "hold",
                    str(tmp_path / "gpus"),
                    "--gpus",
                    "0",
                    "--mem",
                    "10GiB",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            assert holder.stdout is not None
            assert holder.stdout.readline().startswith(b"holding")
            out, err = proc.communicate(timeout=240)
        assert proc.returncode == 1, out + err
        outcomes = [(t["outcome"], t["failure_class"]) for t in report_json(sweep)["trials"]]
        busy = [i for i, o in enumerate(outcomes) if o == ("failed", "gpu_busy")]
        assert len(busy) == 2 and busy[1] == busy[0] + 1, outcomes
        assert outcomes[busy[1] + 1 :] and all(o[0] == "pending" for o in outcomes[busy[1] + 1 :])
        stops = [line for line in err.splitlines() if "stopping the sweep" in line]
        assert len(stops) == 1, err
        assert f"pid {holder.pid}" in stops[0] and "gpu_busy" in stops[0], stops[0]
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(timeout=10)
            if holder.stdout is not None:
                holder.stdout.close()
        kill_tagged("envstop", tmp_path)


def test_the_quickstart_names_what_holds_its_port_and_runs_on_the_port_it_suggests(
    tmp_path: Path,
) -> None:
    spec = yaml.safe_load((_REPO / "examples" / "quickstart.yaml").read_text())
    port = spec["server"]["port"]
    # the quickstart as it is, with one configuration and fast simulated timings
    spec["params"] = {"grid": {"budget": [4], "topk": [1]}}
    spec["server"]["args"].update({"load-time": 0.3, "release-delay": 0.2, "shutdown-delay": 0})
    spec["workloads"][0].update({"concurrency": [1], "requests": 4})
    spec["constraints"] = []
    spec["objective"]["concurrency"] = 1
    sweep = tmp_path / "quickstart.yaml"
    sweep.write_text(yaml.safe_dump(spec, sort_keys=False))
    blocker = socket.socket()
    try:
        with contextlib.suppress(OSError):  # already held by something else: as good
            blocker.bind(("127.0.0.1", port))
            blocker.listen()
        refused = run_cli("run", str(sweep), timeout=120)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert f"port {port} is in use by pid" in lines[0], lines[0]
        found = re.search(r"run on another port with --port (\d+)", lines[0])
        assert found, lines[0]
        done = run_cli("run", str(sweep), "--quiet", "--port", found.group(1), timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [t["outcome"] for t in report_json(sweep)["trials"]] == ["ok"]
    finally:
        blocker.close()
        kill_tagged("quickstart", tmp_path)
