"""The hostile corpus: candidate programs that attack the host or cheat, each run in
the sandbox of every backend that can start here (bwrap, unshare, and none with
its opt-in), reported as a failure (never a pass), and the host checked
unaffected afterwards.

The ``none`` backend (``eval.sandbox: host-filesystem``) has no namespaces: the
attacks in :data:`NONE_DOES_NOT_CONTAIN` reach the host there (docs/evals.md says
so), and are not run against it, so that no test writes the host's shared places
or fills its disk; :func:`test_checks_notice_an_attack_without_isolation` shows
that the checks catch the ones aimed at the test's own files."""

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servesweep.bench.evals import Sandbox, SandboxLimits, SandboxResult, leftovers, procscan
from servesweep.bench.evals.cgroups import find_hierarchies
from servesweep.bench.evals.commands import Backend
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
    "change_world_writable": {"fail"},
    "connect_loopback": {"fail"},
    "deaf_daemon": {"timeout"},
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
    "write_shared_places": {"fail"},
}
BY_BACKEND = {
    # In the unshare backend's chroot the kernel refuses a user namespace (EPERM),
    # so there is no tmpfs to fill; bwrap's --disable-userns refuses it as ENOSPC.
    "unshare": {"tmpfs_namespace": {"fail"}},
}
NONE_DOES_NOT_CONTAIN = {
    "change_world_writable": "changes world-writable files",
    "chdir_upward": "writes in the host's /tmp",
    "connect_loopback": "reaches the host's loopback",
    "delete_files": "deletes world-writable files",
    "fill_disk": "fills the disk of the host's temporary folder",
    "read_secret": "reads world-readable files",
    "write_outside": "writes world-writable folders",
    "write_shared_places": "writes /tmp, /var/tmp, /dev/shm, /run/lock",
}
"""What the ``none`` backend does not protect (and a daemon outliving a SIGKILLed
servesweep: test_evals_killed_runner.py)."""
BACKENDS: tuple[Backend, ...] = ("bwrap", "unshare", "none")
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
    world_writable: Path
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
            "__WORLD_WRITABLE__": str(self.world_writable),
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
            *(Path(folder) / name for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")),
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


def _start(backend: Backend, timeout_s: float) -> Sandbox | str:
    """A started sandbox of ``backend``, or why it cannot start here."""
    if backend == "bwrap" and shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if backend == "unshare" and (os.geteuid() != 0 or shutil.which("unshare") is None):
        return "the unshare backend needs root and util-linux unshare"
    if backend == "none" and os.geteuid() != 0:
        return "as a normal user 'none' runs generated code with the user's own uid"
    box = Sandbox(
        SandboxLimits(timeout_s=timeout_s), backend=backend, host_filesystem=backend == "none"
    )
    try:
        asyncio.run(box.start())
    except SandboxError as exc:
        box.close()
        return f"{backend} cannot start here: {exc}"
    return box


@pytest.fixture(scope="module")
def boxes() -> Iterator[Callable[[Backend, float], Sandbox]]:
    """``boxes(backend, timeout_s)``: one started sandbox per pair for the module
    (the test is skipped where that backend cannot start)."""
    made: dict[tuple[Backend, float], Sandbox | str] = {}

    def get(backend: Backend, timeout_s: float) -> Sandbox:
        if (backend, timeout_s) not in made:
            made[(backend, timeout_s)] = _start(backend, timeout_s)
        box = made[(backend, timeout_s)]
        if isinstance(box, str):
            pytest.skip(box)
        return box

    yield get
    for box in made.values():
        if isinstance(box, Sandbox):
            box.close()


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
    world_writable = folder / "world-writable.txt"
    world_writable.write_text("keep me")
    world_writable.chmod(0o666)
    os.utime(world_writable, (1_000_000_000, 1_000_000_000))
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
        world_writable=world_writable,
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
    assert host.world_writable.read_text() == "keep me", "a world-writable file was changed"
    assert host.world_writable.stat().st_mtime == 1_000_000_000, "its times were changed"
    assert host.secret_path.read_text() == host.secret
    assert not _arrived(host.tcp), "a TCP connection reached the host's loopback"
    with pytest.raises(BlockingIOError):
        host.udp.recvfrom(100)
    assert host.canary.poll() is None, "the canary process was killed"
    assert _processes_with(host.marker) == [], "a process outlived the run"
    if result.uid is not None:
        assert procscan.pids_of_uid(result.uid) == [], "a process of the run's uid is left"
    assert _run_cgroups() == [], "a cgroup of the run is left"


def _cases(names: dict[str, set[str]]) -> list[tuple[Backend, str]]:
    return [
        (backend, name)
        for backend in BACKENDS
        for name in sorted(names)
        if not (backend == "none" and name in NONE_DOES_NOT_CONTAIN)
    ]


@pytest.mark.parametrize(("backend", "name"), _cases(EXPECTED))
def test_hostile_program_is_contained(
    backend: Backend, name: str, boxes: Callable[[Backend, float], Sandbox], host: Host
) -> None:
    program = _program(name, host)
    expected = BY_BACKEND.get(backend, {}).get(name, EXPECTED[name])
    box = boxes(backend, TIMEOUT_S if EXPECTED[name] == {"timeout"} else LIMIT_TIMEOUT_S)
    if name in NEEDS_CGROUP and box.memory_limit == "watch":
        pytest.skip(f"no memory cgroup here ({box.warnings}): {name} would hold its memory")
    started = time.monotonic()
    result = asyncio.run(box.run(program, CHECK, "attack"))
    elapsed = time.monotonic() - started
    assert result.status != "pass"
    assert result.status in expected, (result.status, result.message, result.stderr[-500:])
    assert elapsed < box.limits.timeout_s + 5, f"the run took {elapsed:.1f} s"
    _assert_host_unaffected(host, result)


@pytest.mark.parametrize(("backend", "name"), _cases(CHEATS))
def test_cheat_is_not_scored_pass(
    backend: Backend, name: str, boxes: Callable[[Backend, float], Sandbox], host: Host
) -> None:
    """The expected value is a secret of this test: a program that gives a wrong
    answer must not pass by patching, frame walking, forging or lying about
    equality (the tests and the verdict are in another process)."""
    box = boxes(backend, LIMIT_TIMEOUT_S)
    expected = secrets.token_hex(8)
    check = f"def check(candidate):\n    assert candidate() == {expected!r}\n"
    started = time.monotonic()
    result = asyncio.run(box.run(_program(name, host), check, "attack"))
    elapsed = time.monotonic() - started
    assert result.status in CHEATS[name], (result.status, result.message, result.stderr[-500:])
    assert elapsed < box.limits.timeout_s + 5, f"the run took {elapsed:.1f} s"
    _assert_host_unaffected(host, result)


def test_corpus_is_complete() -> None:
    on_disk = {p.stem for p in HOSTILE.glob("*.py")}
    assert on_disk == set(EXPECTED) | set(CHEATS)
    assert not set(EXPECTED) & set(CHEATS)
    assert len(EXPECTED) >= 21 and len(CHEATS) >= 15
    assert set(NONE_DOES_NOT_CONTAIN) <= set(EXPECTED)


@pytest.mark.parametrize(
    "name", ["change_world_writable", "connect_loopback", "read_secret", "write_outside"]
)
def test_checks_notice_an_attack_without_isolation(
    name: str, boxes: Callable[[Backend, float], Sandbox], host: Host
) -> None:
    """The same attacks, run with isolation off (backend 'none', whose targets are
    the test's own files and sockets), do reach the host and the checks above
    notice: they are not checks that cannot fail."""
    result = asyncio.run(boxes("none", LIMIT_TIMEOUT_S).run(_program(name, host), CHECK, "attack"))
    with pytest.raises(AssertionError):
        _assert_host_unaffected(host, result)
