"""The sandbox's decisions without running anything: refusal, command line, verdicts."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from servesweep.bench.evals import procscan, sandbox
from servesweep.bench.evals.execution import Outcome, judge, read_verdict
from servesweep.bench.evals.sandbox import Sandbox, SandboxLimits
from servesweep.errors import SandboxError

LIMITS = SandboxLimits(timeout_s=5, output_bytes=100)


def test_backend_none_is_refused_without_the_opt_out() -> None:
    box = Sandbox(backend="none")
    try:
        with pytest.raises(SandboxError, match="allow_no_netns: true"):
            asyncio.run(box.start())
    finally:
        box.close()


def test_no_namespace_tool_means_refusal_with_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(sandbox, "_PROBED", {})
    box = Sandbox()
    try:
        with pytest.raises(SandboxError) as err:
            asyncio.run(box.start())
    finally:
        box.close()
    text = str(err.value)
    assert "bwrap is not installed" in text and "unshare is not installed" in text
    assert "apt-get install bubblewrap" in text and "allow_no_netns" in text


def test_bwrap_command_isolates_network_processes_and_files() -> None:
    box = Sandbox(LIMITS)
    try:
        argv, env, workdir = box._command("bwrap", Path("/tmp/run-x"), 1_950_000_000)
    finally:
        box.close()
    assert argv[0] == "bwrap"
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--clearenv" in argv and env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert "/" not in binds and "--bind" not in argv, "nothing of the host is writable"
    assert "/tmp/run-x" in binds and "/usr" in binds
    assert not any(
        b.startswith(("/home", "/work", "/etc/")) and b != "/etc/ld.so.cache" for b in binds
    )
    assert argv[argv.index("--size") + 1] == str(LIMITS.tmpfs_bytes)
    assert workdir == "/tmp"
    if os.geteuid() == 0:
        assert "--cap-drop" in argv


def _outcome(rc: int | None, **kw: bool) -> Outcome:
    return Outcome(rc, b"out", b"line1\nTraceback: boom\n", **kw)


@pytest.mark.parametrize(
    ("outcome", "verdict", "status", "words"),
    [
        (_outcome(0), {"status": "pass", "message": ""}, "pass", ""),
        (_outcome(0), {"status": "fail", "message": "AssertionError"}, "fail", "Assertion"),
        (_outcome(1), {"status": "pass", "message": ""}, "crash", "code 1"),
        (_outcome(0), None, "crash", "before the tests finished"),
        (_outcome(128 + signal.SIGXCPU), None, "resource_limit", "CPU time"),
        (_outcome(-signal.SIGXCPU), None, "resource_limit", "CPU time"),
        (_outcome(128 + signal.SIGSEGV), None, "crash", "SIGSEGV"),
        (_outcome(128 + signal.SIGKILL), None, "crash", "SIGKILL"),
        (_outcome(-9, timed_out=True), None, "timeout", "5 s"),
        (_outcome(-9, overflow=True), {"status": "pass", "message": ""}, "resource_limit", "100"),
    ],
)
def testjudge(outcome: Outcome, verdict: dict[str, str] | None, status: str, words: str) -> None:
    result = judge(outcome, verdict, LIMITS, 0.5)
    assert result.status == status
    assert words in result.message


def test_only_a_verdict_with_the_nonce_counts() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b'PASS {"status": "pass", "message": ""}\n')
        os.write(w, b'{"status": "pass", "message": ""}\n')
        os.write(w, b'abc {"status": "fail", "message": "m"}\n')
        os.close(w)
        assert read_verdict(r, "abc") == {"status": "fail", "message": "m"}
    finally:
        os.close(r)


def test_forged_verdicts_only_give_none() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b'nonce {"status": "weird"}\nnonce not json\n')
        os.close(w)
        assert read_verdict(r, "nonce") is None
    finally:
        os.close(r)


def test_kill_uid_refuses_root() -> None:
    with pytest.raises(ValueError, match="uid 0"):
        procscan.kill_uid(0)


def test_a_verdict_without_message_is_read() -> None:
    r, w = os.pipe()
    try:
        os.write(w, b'n {"status": "pass"}\n')
        os.close(w)
        assert read_verdict(r, "n") == {"status": "pass", "message": ""}
    finally:
        os.close(r)


def test_memory_over_the_total_is_a_resource_limit() -> None:
    result = judge(_outcome(-9, memory=True), None, LIMITS, 0.5)
    assert result.status == "resource_limit" and "2048 MiB" in result.message


def test_process_scans_see_this_process() -> None:
    assert os.getpid() in procscan.pids_of_uid(os.getuid())
    assert procscan.tree_rss(os.getpid()) > 1 << 20
    assert procscan.tree_rss(2**22 + 12345) == 0
