"""The hostile corpus: candidate programs that attack the host or cheat, each run in
the sandbox, reported as a failure (never a pass), and the host checked
unaffected afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servesweep.bench.evals import Sandbox, SandboxLimits, SandboxResult, leftovers, procscan
from servesweep.bench.evals.cgroups import find_hierarchies
from servesweep.errors import SandboxError

HOSTILE = Path(__file__).parent / "hostile"
CHECK = "def check(candidate):\n    assert candidate() == 'escaped'\n"
TIMEOUT_S = 3.0
"""For the programs that must end by the wall clock."""
LIMIT_TIMEOUT_S = 60.0
"""For the others: they end at a limit of their own, which a loaded machine may
take seconds to reach; the wall clock must not come first."""
NEEDS_CGROUP = {"memfd_hoard", "tmpfs_namespace"}
"""Memory held outside processes: only a memory cgroup bounds it."""

EXPECTED = {
    "background_process": {"fail"},
    "chdir_upward": {"fail"},
    "connect_loopback": {"fail"},
    "delete_files": {"fail"},
    "fill_disk": {"resource_limit"},
    "forge_verdict": {"crash"},
    "fork_bomb": {"resource_limit"},
    "gigantic_output": {"resource_limit"},
    "infinite_loop": {"timeout"},
    "kill_parent": {"fail"},
    "memfd_hoard": {"resource_limit"},
    "memory_bomb": {"resource_limit"},
    "memory_bomb_forked": {"resource_limit"},
    "raise_privileges": {"fail"},
    "read_secret": {"fail"},
    "sleep_past_timeout": {"timeout"},
    "tmpfs_namespace": {"resource_limit"},
    "write_outside": {"fail"},
}
CHEATS = {
    # Each of these was scored `pass` when the tests ran in the candidate's process.
    "cheat_call_reporter_via_gc": {"fail"},
    "cheat_call_reporter_via_inspect": {"fail"},
    "cheat_eq_class_entry_point": {"fail"},
    "cheat_eq_everything": {"fail"},
    "cheat_eq_str_subclass": {"fail"},
    "cheat_forge_from_frames": {"fail"},
    "cheat_patch_compile": {"fail"},
    "cheat_patch_exec": {"fail"},
    "cheat_patch_json": {"fail"},
    "cheat_patch_os_module": {"fail"},
    "cheat_read_tests_from_frames": {"fail"},
    # And these were not, and must stay so.
    "cheat_exit_before_tests": {"crash"},
    "cheat_exit_during_call": {"crash"},
    "cheat_print_verdict": {"fail"},
    "cheat_read_tests_from_files": {"fail"},
}


@dataclass
class Host:
    """What the test planted on the host, to check after each attack."""

    folder: Path
    secret: str
    env_secret: str
    secret_path: Path
    outside_path: Path
    delete_dir: Path
    delete_file: Path
    marker: str
    tcp: socket.socket
    udp: socket.socket
    canary: subprocess.Popen[bytes]

    def substitutions(self) -> dict[str, str]:
        return {
            "__SECRET_PATH__": str(self.secret_path),
            "__OUTSIDE_PATH__": str(self.outside_path),
            "__DELETE_DIR__": str(self.delete_dir),
            "__DELETE_FILE__": str(self.delete_file),
            "__MARKER__": self.marker,
            "__TCP_PORT__": str(self.tcp.getsockname()[1]),
            "__UDP_PORT__": str(self.udp.getsockname()[1]),
            "__TEST_PID__": str(os.getpid()),
            "__CANARY_PID__": str(self.canary.pid),
        }

    def marker_paths(self) -> list[Path]:
        name = f"{self.marker}.txt"
        return [
            Path("/") / name,
            Path(tempfile.gettempdir()) / name,
            Path.home() / name,
            Path.cwd() / name,
            Path("/tmp") / name,
        ]


def _processes_with(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


def _bwrap(timeout_s: float) -> Iterator[Sandbox]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    box = Sandbox(SandboxLimits(timeout_s=timeout_s), backend="bwrap")
    try:
        asyncio.run(box.start())
    except SandboxError as exc:
        box.close()
        pytest.skip(f"bwrap cannot make namespaces here: {exc}")
    yield box
    box.close()


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    yield from _bwrap(LIMIT_TIMEOUT_S)


@pytest.fixture(scope="module")
def short_sandbox() -> Iterator[Sandbox]:
    yield from _bwrap(TIMEOUT_S)


def _run_cgroups() -> list[Path]:
    """This process's run cgroups (none may be left after a run)."""
    hierarchies, _ = find_hierarchies()
    mine = leftovers.owner_prefix()
    return [p for h in hierarchies if h.base.is_dir() for p in h.base.glob(f"{mine}*")]


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    folder = Path(tempfile.mkdtemp(prefix="servesweep-hostile-"))
    # World-readable and world-writable: only the sandbox's isolation protects them.
    folder.chmod(0o777)
    secret = "secret-" + secrets.token_hex(12)
    secret_path = folder / "secret.txt"
    secret_path.write_text(secret)
    secret_path.chmod(0o644)
    delete_dir = folder / "keep"
    delete_dir.mkdir()
    delete_dir.chmod(0o777)
    for i in range(3):
        (delete_dir / f"file{i}").write_text("keep me")
        (delete_dir / f"file{i}").chmod(0o666)
    delete_file = folder / "keep-file"
    delete_file.write_text("keep me")
    delete_file.chmod(0o666)
    env_secret = "sk-" + secrets.token_hex(12)
    monkeypatch.setenv("SERVESWEEP_TEST_API_KEY", env_secret)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    canary = subprocess.Popen(["sleep", "300"])
    state = Host(
        folder=folder,
        secret=secret,
        env_secret=env_secret,
        secret_path=secret_path,
        outside_path=folder / "outside.txt",
        delete_dir=delete_dir,
        delete_file=delete_file,
        marker="servesweep-hostile-" + secrets.token_hex(6),
        tcp=tcp,
        udp=udp,
        canary=canary,
    )
    try:
        yield state
    finally:
        canary.kill()
        canary.wait()
        tcp.close()
        udp.close()
        for path in state.marker_paths():
            with contextlib.suppress(OSError):
                path.unlink()
        for pid in _processes_with(state.marker):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        shutil.rmtree(folder, ignore_errors=True)


def _program(name: str, host: Host) -> str:
    text = (HOSTILE / f"{name}.py").read_text()
    for key, value in host.substitutions().items():
        text = text.replace(key, value)
    return text


def _arrived(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _assert_host_unaffected(host: Host, result: SandboxResult) -> None:
    seen = result.stdout + result.stderr + result.message
    assert host.secret not in seen, "the secret file leaked"
    assert host.env_secret not in seen, "the parent's environment leaked"
    assert not host.outside_path.exists(), "a file was written outside the sandbox"
    for path in host.marker_paths():
        assert not path.exists(), f"{path} was written"
    assert sorted(p.name for p in host.delete_dir.iterdir()) == ["file0", "file1", "file2"]
    assert host.delete_file.read_text() == "keep me"
    assert host.secret_path.read_text() == host.secret
    assert not _arrived(host.tcp), "a TCP connection reached the host's loopback"
    with pytest.raises(BlockingIOError):
        host.udp.recvfrom(100)
    assert host.canary.poll() is None, "the canary process was killed"
    assert _processes_with(host.marker) == [], "a process outlived the run"
    if result.uid is not None:
        assert procscan.pids_of_uid(result.uid) == [], "a process of the run's uid is left"
    assert _run_cgroups() == [], "a cgroup of the run is left"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_program_is_contained(
    name: str, sandbox: Sandbox, short_sandbox: Sandbox, host: Host
) -> None:
    program = _program(name, host)
    box = short_sandbox if EXPECTED[name] == {"timeout"} else sandbox
    if name in NEEDS_CGROUP and box.memory_limit == "watch":
        pytest.skip(f"no memory cgroup here ({box.warnings}): {name} would hold its memory")
    started = time.monotonic()
    result = asyncio.run(box.run(program, CHECK, "attack"))
    elapsed = time.monotonic() - started
    assert result.status != "pass"
    assert result.status in EXPECTED[name], (result.status, result.message, result.stderr[-500:])
    assert elapsed < box.limits.timeout_s + 5, f"the run took {elapsed:.1f} s"
    _assert_host_unaffected(host, result)


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_is_not_scored_pass(name: str, sandbox: Sandbox, host: Host) -> None:
    """The expected value is a secret of this test: a program that gives a wrong
    answer must not pass by patching, frame walking, forging or lying about
    equality (the tests and the verdict are in another process)."""
    expected = secrets.token_hex(8)
    check = f"def check(candidate):\n    assert candidate() == {expected!r}\n"
    started = time.monotonic()
    result = asyncio.run(sandbox.run(_program(name, host), check, "attack"))
    elapsed = time.monotonic() - started
    assert result.status in CHEATS[name], (result.status, result.message, result.stderr[-500:])
    assert elapsed < sandbox.limits.timeout_s + 5, f"the run took {elapsed:.1f} s"
    _assert_host_unaffected(host, result)


def test_corpus_is_complete() -> None:
    on_disk = {p.stem for p in HOSTILE.glob("*.py")}
    assert on_disk == set(EXPECTED) | set(CHEATS)
    assert not set(EXPECTED) & set(CHEATS)
    assert len(EXPECTED) >= 18 and len(CHEATS) >= 15


@pytest.mark.parametrize("name", ["connect_loopback", "read_secret", "write_outside"])
def test_checks_notice_an_attack_without_isolation(name: str, host: Host) -> None:
    """The same attacks, run with isolation off (backend 'none'), do reach the host
    and the checks above notice: they are not checks that cannot fail."""
    box = Sandbox(SandboxLimits(timeout_s=LIMIT_TIMEOUT_S), backend="none", allow_no_netns=True)
    try:
        result = asyncio.run(box.run(_program(name, host), CHECK, "attack"))
    finally:
        box.close()
    with pytest.raises(AssertionError):
        _assert_host_unaffected(host, result)


UNSHARE_SUBSET = ["background_process", "connect_loopback", "fork_bomb", "kill_parent"]


@pytest.fixture(scope="module")
def unshare_sandbox() -> Iterator[Sandbox]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the unshare backend needs root and util-linux unshare")
    box = Sandbox(SandboxLimits(timeout_s=LIMIT_TIMEOUT_S), backend="unshare")
    try:
        asyncio.run(box.start())
    except SandboxError as exc:
        box.close()
        pytest.skip(f"unshare cannot make namespaces here: {exc}")
    yield box
    box.close()


@pytest.mark.parametrize("name", UNSHARE_SUBSET)
def test_unshare_backend_contains_network_and_processes(
    name: str, unshare_sandbox: Sandbox, host: Host
) -> None:
    """The fallback without bwrap (root, util-linux unshare): network, PID and
    process-limit containment hold; its filesystem view is the host's (see docs)."""
    result = asyncio.run(unshare_sandbox.run(_program(name, host), CHECK, "attack"))
    assert result.status in EXPECTED[name], (result.status, result.message)
    _assert_host_unaffected(host, result)
