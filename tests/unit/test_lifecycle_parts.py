"""Pure parts of the lifecycle: /proc/net parsing, command templates, tag prefixes,
response parsing, and the release gate over a scripted GPU probe."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Sequence

import pytest

from servesweep.errors import LaunchError, TrialFailed
from servesweep.models import FailureClass, GpuHolder, GpuState
from servesweep.servers import http_probe, ports, procs
from servesweep.servers.launchers.command import render
from servesweep.servers.ownership import OwnerKind, Ownership, owner_env
from servesweep.servers.readiness import HttpAnswer, count_tokens, first_model
from servesweep.servers.release import ReleasePolicy, wait_released

GiB = 2**30
DEAD = 2**22 + 12345  # above pid_max's default: never a live process


def test_proc_net_addresses_parse() -> None:
    assert ports._parse_addr("0100007F:1F90", False) == ("127.0.0.1", 8080)
    assert ports._parse_addr("00000000000000000000000000000000:0050", True) == ("::", 80)
    mapped = "0000000000000000FFFF00000100007F:1F90"
    assert ports._parse_addr(mapped, True) == ("127.0.0.1", 8080)
    assert ports._conflicts("0.0.0.0", {"127.0.0.1"})
    assert not ports._conflicts("127.0.0.2", {"127.0.0.1"})
    assert ports._host_addrs("0.0.0.0") is None


def test_command_templates_fill_placeholders_and_leave_shell_braces() -> None:
    argv = ["vllm", "serve", "m", "--budget", "8", "--enforce-eager", "--x=1"]
    values = {"port": "8000", "args": "serve m --budget 8"}
    out = render("run {args} --port {port} ${HOME} {{lit}} {param.budget}", values, argv)
    assert out == "run serve m --budget 8 --port 8000 ${HOME} {lit} 8"
    assert render("{param.enforce_eager} {param.x}", {}, argv) == "true 1"
    with pytest.raises(LaunchError, match="no --topk"):
        render("{param.topk}", {}, argv)


def test_instance_tags_are_unique_and_safe() -> None:
    tag = procs.new_instance_tag("my sweep-3")
    assert tag.startswith("my_sweep-3-") and " " not in tag
    assert procs.new_instance_tag("my sweep-3") != tag


def test_ownership_of_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only this slot's instances and a dead run's of the same database may be killed;
    a sibling slot's and another database's (a concurrent sweep, even of the same
    name) never, unless the kill-own policy says any servesweep instance."""
    envs = {
        1: {procs.TAG_ENV: "q-1-aa", **owner_env("db1", "run1", 0, "/a/s.db")},
        2: {procs.TAG_ENV: "q-2-bb", **owner_env("db1", "run1", 1, "/a/s.db")},
        3: {procs.TAG_ENV: "q-3-cc", **owner_env("db1", "run0", 0, "/a/s.db")},
        4: {procs.TAG_ENV: "q-1-dd", **owner_env("db2", "run9", 0, "/b/s.db")},
        5: {"PATH": "/usr/bin"},
        6: {procs.TAG_ENV: "old-style-tag"},
    }
    monkeypatch.setattr(procs, "environ_of", lambda pid: envs.get(pid))
    own = Ownership("db1", "run1", 0)
    kinds = {pid: own.owner(pid).kind for pid in envs}
    assert kinds == {
        1: OwnerKind.MINE,
        2: OwnerKind.SIBLING,
        3: OwnerKind.LEFTOVER,
        4: OwnerKind.OTHER_RUN,
        5: OwnerKind.FOREIGN,
        6: OwnerKind.OTHER_RUN,
    }
    assert [pid for pid in envs if own.may_kill(pid)] == [1, 3]
    assert [pid for pid in envs if own.may_kill(pid, kill_any_servesweep=True)] == [1, 3, 4, 6]
    assert "/b/s.db" in own.owner(4).describe()


def test_generation_answers_count_tokens() -> None:
    assert count_tokens(HttpAnswer(200, b'{"usage": {"completion_tokens": 3}}', set())) == 3
    assert count_tokens(HttpAnswer(200, b'{"choices": [{"text": "hi"}]}', set())) == 1
    assert count_tokens(HttpAnswer(200, b'{"choices": [{"message": {"content": ""}}]}', set())) == 0
    assert count_tokens(HttpAnswer(200, b"not json", set())) == 0
    assert first_model(HttpAnswer(200, b'{"data": [{"id": "m1"}, {"id": "m2"}]}', set())) == "m1"
    assert first_model(HttpAnswer(200, b'{"data": []}', set())) is None
    # a reasoning model's first words are reasoning, not content
    thinking = b'{"choices": [{"message": {"content": null, "reasoning_content": "Hm"}}]}'
    assert count_tokens(HttpAnswer(200, thinking, set())) == 1
    # a streamed answer counts what the stream showed, not its (partial) body
    streamed = HttpAnswer(200, b'data: {"choices": [', set(), tokens=1, note="first token")
    assert count_tokens(streamed) == 1


def test_stream_events_show_tokens() -> None:
    assert http_probe._event_tokens({"choices": [{"delta": {"content": " hi"}}]}) == 1
    assert http_probe._event_tokens({"choices": [{"delta": {"role": "assistant"}}]}) == 0
    assert http_probe._event_tokens({"choices": [], "usage": {"completion_tokens": 4}}) == 4
    assert http_probe._event_tokens({"choices": [{"text": ""}], "usage": None}) == 0
    assert http_probe._event_tokens("not an event") == 0


class ScriptedProbe:
    """Returns the scripted snapshots in order, then repeats the last one."""

    name = "scripted"

    def __init__(self, script: Sequence[list[GpuState]]) -> None:
        self.script = list(script)
        self.calls = 0

    def snapshot(self, gpus: Sequence[int] | None = None) -> list[GpuState]:
        state = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return state

    def describe(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass


def _gpu(used: int, *holders: GpuHolder) -> list[GpuState]:
    return [GpuState(0, "g", 80 * GiB, used, holders)]


def test_release_waits_for_the_old_holder_then_settles() -> None:
    probe = ScriptedProbe(
        [_gpu(60 * GiB, GpuHolder(DEAD, 60 * GiB))] * 5 + [_gpu(30 * GiB)] * 3 + [_gpu(0)]
    )
    result = wait_released(
        probe,
        [0],
        {0: 0},
        ReleasePolicy(GiB, 0.05, 5, "wait"),
        old_pids={DEAD},
    )
    assert probe.calls >= 10 and result.polls == probe.calls
    assert result.seconds >= result.released_s and result.seconds - result.released_s >= 0.05
    assert result.cleaned == ()


def test_release_times_out_as_gpu_busy_naming_holders() -> None:
    probe = ScriptedProbe([_gpu(40 * GiB, GpuHolder(DEAD, 40 * GiB, "python"))])
    with pytest.raises(TrialFailed) as caught:
        wait_released(
            probe,
            [0],
            {0: 0},
            ReleasePolicy(GiB, 0.0, 0.2, "wait"),
            old_pids={DEAD},
        )
    ev = caught.value.evidence
    assert caught.value.failure_class is FailureClass.GPU_BUSY
    assert ev.reason == "not_released"
    assert [h.pid for h in ev.gpu_holders] == [DEAD]
    assert ev.details["over_tolerance"] == {0: {"used": 40 * GiB, "baseline": 0}}


def test_release_fails_at_once_on_a_live_foreign_holder_under_fail() -> None:
    me = os.getpid()  # alive, not tagged: foreign (and never signalled by the gate)
    probe = ScriptedProbe([_gpu(20 * GiB, GpuHolder(me, 20 * GiB))])
    with pytest.raises(TrialFailed) as caught:
        wait_released(
            probe,
            [0],
            {0: 0},
            ReleasePolicy(GiB, 0.0, 30, "fail"),
            old_pids=set(),
        )
    assert caught.value.evidence.reason == "foreign_holder"
    assert probe.calls == 1
    assert caught.value.evidence.gpu_holders[0].cmdline  # filled from /proc


def test_release_within_baseline_tolerates_resident_processes() -> None:
    me = os.getpid()
    probe = ScriptedProbe([_gpu(GiB // 2, GpuHolder(me, GiB // 2))])
    result = wait_released(
        probe,
        [0],
        {0: GiB // 2},
        ReleasePolicy(GiB, 0.0, 1, "fail"),
        old_pids=set(),
    )
    assert result.polls == 1


@contextlib.contextmanager
def _listeners() -> Iterator[list[socket.socket]]:
    with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        v6.bind(("::1", 0))
        v6.listen()
        yield [v4, v6]


def test_proc_net_finds_listeners_and_their_owner() -> None:
    with _listeners() as socks:
        for sock in socks:
            host, port = sock.getsockname()[:2]
            assert len(ports._sockets(port, listening=True)) == 1
            assert ports.owned_by(host, port, [os.getpid()])
            assert not ports.owned_by("127.0.0.1", port + 1 if port < 65535 else 1, [])


def _netlink_unavailable() -> str | None:
    """Why this process cannot use netlink sock_diag (a sandbox may forbid it)."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, ports._NETLINK_SOCK_DIAG):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def test_netlink_and_proc_net_agree_on_listeners() -> None:
    why = _netlink_unavailable()
    if why is not None:
        pytest.skip(
            f"netlink sock_diag cannot be opened here ({why}); ports falls back to "
            "/proc/net, which test_proc_net_finds_listeners_and_their_owner covers"
        )
    with _listeners() as socks:
        for sock in socks:
            port = sock.getsockname()[1]
            via_netlink = ports._diag_listening(port)
            assert via_netlink is not None, "netlink opens but its answer was not understood"
            assert via_netlink == ports._sockets(port, listening=True)
