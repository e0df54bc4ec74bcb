"""The sandbox's decisions without running anything: refusal, command line, statuses."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from servesweep.bench.evals import commands, procscan, sandbox
from servesweep.bench.evals.commands import Commands
from servesweep.bench.evals.outcome import Ended, Outcome, decide, parse_verdict
from servesweep.bench.evals.sandbox import Sandbox, SandboxLimits
from servesweep.errors import SandboxError

LIMITS = SandboxLimits(timeout_s=5, output_bytes=100)


def test_backend_none_is_refused_without_the_opt_in() -> None:
    box = Sandbox(backend="none")
    try:
        with pytest.raises(SandboxError, match="sandbox: host-filesystem to accept that"):
            asyncio.run(box.start())
    finally:
        box.close()


@pytest.mark.parametrize("host_filesystem", [False, True])
def test_no_namespace_tool_means_refusal_with_advice(
    monkeypatch: pytest.MonkeyPatch, host_filesystem: bool
) -> None:
    """`auto` never falls back to the host's filesystem, opt-in or not: that takes
    the 'none' backend by name."""
    monkeypatch.setattr(sandbox.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(sandbox, "_PROBED", {})
    monkeypatch.setattr(Sandbox, "_prepare", lambda self: None)
    box = Sandbox(host_filesystem=host_filesystem)
    try:
        with pytest.raises(SandboxError) as err:
            asyncio.run(box.start())
    finally:
        box.close()
    text = str(err.value)
    assert "bwrap is not installed" in text and "unshare is not installed" in text
    assert "apt-get install bubblewrap" in text and "sandbox: host-filesystem" in text
    assert "\n" not in text


def test_bwrap_command_isolates_network_processes_files_and_namespaces(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(commands, "bwrap_can_disable_userns", lambda: True)
    root = os.geteuid() == 0
    uid = 1_950_000_000 if root else None
    launch = Commands(LIMITS, None, root).launch("bwrap", "candidate", tmp_path, uid, {}, (7, 8))
    argv = launch.argv
    assert argv[0] == "bwrap" and launch.pass_fds == (7, 8)
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"):
        assert flag in argv
    # Its own user namespace, in which it cannot make another (no private mounts).
    assert "--unshare-user" in argv and "--disable-userns" in argv
    assert "--clearenv" in argv and launch.env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert "/" not in binds and "--bind" not in argv, "nothing of the host is writable"
    assert str(tmp_path / "candidate") in binds and "/usr" in binds
    assert not any(
        b.startswith(("/home", "/work", "/etc/")) and b != "/etc/ld.so.cache" for b in binds
    )
    assert argv[argv.index("--size") + 1] == str(LIMITS.tmpfs_bytes)
    # The sandbox's root and /dev, owned by the program in its namespace, are read-only.
    remounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--remount-ro"]
    assert sorted(remounts) == ["/", "/dev"]
    assert argv.index("--remount-ro") > argv.index("--tmpfs")
    if os.geteuid() == 0:
        # bwrap itself runs as the fresh uid: no capability is ever held by the run.
        assert launch.user == uid and "--cap-add" not in argv
        assert (tmp_path / "candidate").stat().st_uid == uid, "only its own uid reads it"


def _outcome(
    rc: int | None = 0,
    verdict: dict[str, str] | None = None,
    *,
    judge_rc: int | None = 0,
    on_its_own: bool = True,
    **flags: object,
) -> Outcome:
    candidate = Ended(rc, b"out", b"line1\nTraceback: boom\n", on_its_own)
    judge = Ended(judge_rc, b"", b"judge trouble\n", True)
    return Outcome(candidate, judge, verdict, 0.5, **flags)  # type: ignore[arg-type]


PASS = {"status": "pass", "message": ""}


def gone(why: str = "it ended before answering") -> dict[str, str]:
    return {"status": "gone", "message": why}


@pytest.mark.parametrize(
    ("outcome", "status", "words"),
    [
        (_outcome(0, PASS), "pass", ""),
        (_outcome(0, {"status": "fail", "message": "AssertionError"}), "fail", "Assertion"),
        # The judge's word counts, whatever the candidate's exit status.
        (_outcome(1, PASS, on_its_own=False), "pass", ""),
        (_outcome(0, gone()), "crash", "exited with code 0 before the tests finished"),
        (_outcome(128 + signal.SIGXCPU, gone()), "resource_limit", "CPU time"),
        (_outcome(-signal.SIGXCPU, gone()), "resource_limit", "CPU time"),
        (_outcome(128 + signal.SIGXFSZ, gone()), "resource_limit", "file size"),
        (_outcome(128 + signal.SIGSEGV, gone()), "crash", "SIGSEGV"),
        (_outcome(None, gone("it sent x"), on_its_own=False), "crash", "stopped answering"),
        (_outcome(-9, None, timed_out=True), "timeout", "5 s"),
        (_outcome(-9, PASS, overflow=True), "resource_limit", "100"),
        (_outcome(-9, PASS, memory="cgroup"), "resource_limit", "memory cgroup"),
        (_outcome(-9, None, memory="watch"), "resource_limit", "2048 MiB (watched)"),
        # No verdict from the judge: never a pass.
        (_outcome(0, None), "crash", "without a verdict (exit code 0); judge trouble"),
        (_outcome(0, PASS, judge_rc=1), "crash", "without a verdict (exit code 1)"),
        (_outcome(0, None, judge_rc=128 + signal.SIGXCPU), "resource_limit", "CPU time"),
        (_outcome(0, PASS, error="cannot start"), "crash", "cannot start"),
    ],
)
def test_decide(outcome: Outcome, status: str, words: str) -> None:
    result = decide(outcome, LIMITS)
    assert result.status == status
    assert words in result.message
    assert result.seconds == 0.5


def test_the_exit_code_is_reported_only_when_the_program_ended_by_itself() -> None:
    assert decide(_outcome(3, gone()), LIMITS).exit_code == 3
    assert decide(_outcome(-9, PASS, on_its_own=False), LIMITS).exit_code is None


def test_verdicts_are_parsed_strictly() -> None:
    assert parse_verdict(b'{"status": "fail", "message": "m"}\n') == {
        "status": "fail",
        "message": "m",
    }
    assert parse_verdict(b'{"status": "pass"}\n') == {"status": "pass", "message": ""}
    assert parse_verdict(b'not json\n{"status": "weird"}\n[1]\n') is None
    assert parse_verdict(b"") is None


def test_kill_uid_refuses_root() -> None:
    with pytest.raises(ValueError, match="uid 0"):
        procscan.kill_uid(0)
    with pytest.raises(ValueError, match="uid 0"):
        procscan.kill_uids({1_950_000_000, 0})


def test_process_scans_see_this_process() -> None:
    assert os.getpid() in procscan.pids_of_uid(os.getuid())
    assert procscan.tree_rss(os.getpid()) > 1 << 20
    assert procscan.tree_rss(2**22 + 12345) == 0


def test_unshare_command_dies_with_servesweep_and_builds_a_root_of_its_own(
    tmp_path: Path,
) -> None:
    root = os.geteuid() == 0
    uid = 1_950_000_000 if root else None
    launch = Commands(LIMITS, None, root).launch("unshare", "judge", tmp_path, uid, {}, (7,))
    argv = launch.argv
    # A parent-death signal on unshare, which passes it on to the namespace's first
    # process (--kill-child); confine.py sets it again after the uid drop.
    assert argv[:4] == ["setpriv", "--pdeathsig", "KILL", "--"]
    tail = argv[argv.index("unshare") :]
    for flag in ("--mount", "--net", "--pid", "--fork", "--kill-child", "--ipc"):
        assert flag in tail[: tail.index("--")]
    job = json.loads((tmp_path / "judge" / "job.json").read_text())
    plan = job["rootfs"]
    sources = [source for source, _ in plan["binds"]]
    assert "/usr" in sources and sources == [target for _, target in plan["binds"]]
    assert not any(
        s.startswith(("/home", "/work", "/tmp", "/etc/"))
        for s in sources
        if s != "/etc/ld.so.cache"
    )
    assert plan["folder"] == str(tmp_path / "judge") and plan["tmpfs_bytes"] == LIMITS.tmpfs_bytes
    assert not plan["base"].startswith(plan["folder"] + "/"), (
        "the root's base must not show in /sandbox"
    )
    assert job["workdir"] == "/tmp" and launch.env["HOME"] == "/tmp" == launch.env["TMPDIR"]
    assert "rootfs.py" in os.listdir(tmp_path / "judge")
