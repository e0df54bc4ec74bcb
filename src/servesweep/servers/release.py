"""The release gate: the old instance is gone and its GPU memory is back.

Order of a restart: :func:`stop_instance` (every process of the old instance gone,
or ``stop_failed`` with evidence), then :func:`wait_released` (no process of the old
instance listed on the next trial's GPUs, used memory within ``tolerance`` of the
baseline measured before the sweep, stable for ``settle`` seconds, or ``gpu_busy``
naming the holders). The gate polls adaptively — 5 ms at first, backing off to
50 ms — so it costs little beyond the physical release plus the settle window.

Holders are sorted into three kinds:

* the old instance (a PID of ``old_pids``): waited for; killed if still alive;
* servesweep's own (``ownership``, see ``servers.ownership``: an orphan of this slot's
  instances, or of an instance an earlier, dead run of the same results database
  left): killed and reported in ``cleaned``;
* foreign (anything else alive, a concurrent servesweep run's instance included):
  handled by ``foreign_policy`` — ``wait`` (until the timeout), ``fail`` (``gpu_busy``
  at once), ``kill-own`` (kill holders that any servesweep run started, reported in
  ``cleaned`` with their owner; ``gpu_busy`` at once for others). A foreign holder
  blocks only while used memory is over the tolerance and it holds more than the
  tolerance itself: small resident processes present at baseline time do not.
  ``gpu_busy`` names each holder and, for a servesweep instance, its owner.

The baseline (what "released" means) is taken by :func:`prepare_gpus` only on idle
GPUs: after servesweep's own leftovers are gone, no holder but small residents is
listed, and the memory is stable; a baseline stored by an earlier run of the same
sweep on the same machine is reused (lowered when the GPUs now use less), never
replaced by a higher measurement.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from servesweep.errors import GpuProbeError, Interrupted, TrialFailed
from servesweep.models import (
    Evidence,
    FailureClass,
    GpuHolder,
    GpuState,
    InstanceRecord,
    ProcessInfo,
    short_cmdline,
)
from servesweep.servers import procs
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.launchers.base import Launcher, StopResult
from servesweep.servers.ownership import OwnerKind, Ownership
from servesweep.spec.schema import ReleaseSpec, Timeouts

__all__ = [
    "FOREIGN_POLICIES",
    "Prepared",
    "ReleasePolicy",
    "ReleaseResult",
    "check_foreign_holders",
    "describe_holder",
    "measure_baseline",
    "prepare_gpus",
    "stop_instance",
    "wait_released",
]

FOREIGN_POLICIES = ("wait", "fail", "kill-own")
_FIRST_POLL = 0.005
_MAX_POLL = 0.05
_PROBE_RETRIES = 3


@dataclass(frozen=True)
class ReleasePolicy:
    """How the release gate judges a GPU released: used memory within ``tolerance``
    bytes of the baseline for ``settle`` seconds, within ``timeout`` seconds;
    ``foreign_policy`` (one of :data:`FOREIGN_POLICIES`) for holders that are not
    this sweep's; ``ownership`` tells servesweep's own holders apart (None: none are)."""

    tolerance: int
    settle: float
    timeout: float
    foreign_policy: str = "wait"
    ownership: Ownership | None = None

    def __post_init__(self) -> None:
        if self.foreign_policy not in FOREIGN_POLICIES:
            raise ValueError(
                f"foreign_policy must be one of {FOREIGN_POLICIES}: {self.foreign_policy!r}"
            )

    @classmethod
    def of(
        cls, release: ReleaseSpec, timeouts: Timeouts, ownership: Ownership | None = None
    ) -> ReleasePolicy:
        """The policy a server's ``release`` and ``timeouts.release`` settings make."""
        return cls(
            tolerance=release.tolerance,
            settle=release.settle,
            timeout=timeouts.release,
            foreign_policy=release.foreign_holders,
            ownership=ownership,
        )


@dataclass(frozen=True)
class ReleaseResult:
    seconds: float
    """Time spent in the gate, settle window included."""
    polls: int
    cleaned: tuple[ProcessInfo, ...] = ()
    """Orphans of servesweep's own instances that the gate killed."""
    released_s: float = 0.0
    """When the condition first held for good (``seconds - released_s`` is the settle cost)."""


@dataclass(frozen=True)
class Prepared:
    """The GPUs before the sweep: the baseline and what the foreign-holder check saw."""

    baseline: dict[int, int]
    holders: tuple[GpuHolder, ...] = ()
    """Live holders found before the sweep (name and command line filled)."""
    cleaned: tuple[ProcessInfo, ...] = ()
    """servesweep's own leftover instances that were killed."""
    waited_s: float = 0.0
    source: str = "measured"
    """``measured`` on idle GPUs, or ``stored`` (an earlier run's, maybe lowered)."""
    notes: tuple[str, ...] = ()
    """What a user should know about the baseline (a higher reading refused...)."""


def measure_baseline(probe: GpuProbe, gpus: Sequence[int]) -> dict[int, int]:
    """Used bytes per GPU now (take it before the sweep starts anything)."""
    return {state.index: state.used_bytes for state in probe.snapshot(list(gpus))}


def stop_instance(launcher: Launcher, instance: InstanceRecord, timeouts: Timeouts) -> StopResult:
    """Stop the whole instance; raise ``stop_failed`` naming every survivor."""
    result = launcher.stop(instance, timeouts.stop, timeouts.kill)
    if not result.survivors:
        return result
    infos = procs.describe_all(result.survivors)
    stuck = [p for p in infos if p.state == "D"]
    hint = (
        "a process in state D is blocked in the kernel (often the GPU driver) and ignores "
        "signals until the kernel call returns; check `cat /proc/PID/stack` and dmesg"
        if stuck
        else "check what these processes wait for and stop them by hand"
    )
    raise TrialFailed(
        FailureClass.STOP_FAILED,
        Evidence(
            message=(
                f"{len(infos)} process(es) of the old instance survived SIGKILL for "
                f"{timeouts.kill:g}s: " + "; ".join(p.describe() for p in infos) + f" — {hint}"
            ),
            reason="unkillable" if stuck else "survivors",
            processes=infos,
            log_path=instance.log_path,
            timings={"stop_s": result.seconds},
            details={"notes": list(result.notes), "killed": list(result.killed)},
        ),
    )


def describe_holder(holder: GpuHolder) -> GpuHolder:
    """The holder with its name and command line filled in (when the process is visible)."""
    if holder.name and holder.cmdline:
        return holder
    info = procs.describe(holder.pid)
    if info.state == "gone":
        return GpuHolder(holder.pid, holder.used_bytes, holder.name or "(exited)", holder.cmdline)
    return GpuHolder(
        holder.pid,
        holder.used_bytes,
        holder.name or info.name,
        holder.cmdline or info.cmdline,
    )


def _merge_holders(states: Iterable[GpuState]) -> list[GpuHolder]:
    by_pid: dict[int, GpuHolder] = {}
    for state in states:
        for h in state.holders:
            old = by_pid.get(h.pid)
            used = h.used_bytes + (old.used_bytes if old else 0)
            by_pid[h.pid] = GpuHolder(h.pid, used, h.name, h.cmdline)
    return [describe_holder(h) for _, h in sorted(by_pid.items())]


def check_foreign_holders(probe: GpuProbe, gpus: Sequence[int]) -> list[GpuHolder]:
    """Live processes holding memory on ``gpus`` (one entry per PID, memory summed),
    with name and command line: the pre-sweep report."""
    holders = _merge_holders(probe.snapshot(list(gpus)))
    return [h for h in holders if not procs.is_gone(h.pid)]


def _ours_to_kill(pid: int, ownership: Ownership | None, foreign_policy: str) -> bool:
    if ownership is None:
        return False
    return ownership.may_kill(pid, kill_any_servesweep=foreign_policy == "kill-own")


def _kill(pid: int, ownership: Ownership | None = None) -> ProcessInfo:
    info = procs.describe(pid)
    if ownership is not None:
        owner = ownership.owner(pid)
        if owner.kind is OwnerKind.OTHER_RUN:
            # the kill-own policy: say whose instance this was
            info = ProcessInfo(
                info.pid, info.state, info.wchan, f"{info.cmdline} [{owner.describe()}]", info.name
            )
    procs.signal_all(procs.tree(pid) or {pid}, signal.SIGKILL)
    return info


def _owner_notes(holders: Sequence[GpuHolder], ownership: Ownership | None) -> str:
    """`` — pid 12: a servesweep instance of another sweep (...)`` for servesweep holders."""
    if ownership is None:
        return ""
    notes = []
    for h in holders:
        owner = ownership.owner(h.pid)
        if owner.kind is not OwnerKind.FOREIGN:
            notes.append(f"pid {h.pid} is {owner.describe()}")
    return ("; " + "; ".join(notes)) if notes else ""


def _busy(
    message: str,
    states: Sequence[GpuState],
    baseline: dict[int, int],
    tolerance: int,
    elapsed: float,
    reason: str,
    ownership: Ownership | None = None,
) -> TrialFailed:
    holders = tuple(_merge_holders(states))
    over = {
        s.index: {"used": s.used_bytes, "baseline": baseline.get(s.index, 0)}
        for s in states
        if s.used_bytes > baseline.get(s.index, 0) + tolerance
    }
    names = "; ".join(
        h.describe() + (f" {short_cmdline(h.cmdline)!r}" if h.cmdline else "") for h in holders
    )
    text = message + (f"; holders: {names}" if names else "; no process is listed as holder")
    text += _owner_notes(holders, ownership)
    return TrialFailed(
        FailureClass.GPU_BUSY,
        Evidence(
            message=text,
            reason=reason,
            gpu_holders=holders,
            timings={"release_s": elapsed},
            details={"over_tolerance": over, "tolerance": tolerance},
        ),
    )


def wait_released(
    probe: GpuProbe,
    gpus: Sequence[int],
    baseline: dict[int, int],
    policy: ReleasePolicy,
    *,
    old_pids: set[int],
    cancelled: Callable[[], bool] | None = None,
) -> ReleaseResult:
    """Wait until the old instance's GPU memory is back (see the module docstring).

    ``cancelled``: polled between reads; when it returns True the wait stops with
    ``Interrupted`` (the sweep is being stopped)."""
    tolerance, settle, timeout = policy.tolerance, policy.settle, policy.timeout
    foreign_policy, ownership = policy.foreign_policy, policy.ownership
    gpu_list = list(gpus)
    t0 = time.monotonic()
    delay = _FIRST_POLL
    polls = 0
    ok_since: float | None = None
    cleaned: dict[int, ProcessInfo] = {}
    probe_errors = 0
    while True:
        try:
            states = probe.snapshot(gpu_list)
        except GpuProbeError:
            probe_errors += 1  # one bad read (a driver hiccup) is retried, a broken probe not
            if probe_errors >= _PROBE_RETRIES or time.monotonic() - t0 >= timeout:
                raise
            time.sleep(_MAX_POLL)
            continue
        probe_errors = 0
        polls += 1
        now = time.monotonic()
        blocking = False
        foreign: list[GpuHolder] = []
        for state in states:
            for holder in state.holders:
                pid = holder.pid
                if pid in cleaned:
                    blocking = True
                    continue
                gone = procs.is_gone(pid)
                if pid in old_pids:
                    blocking = True
                    if not gone:
                        cleaned[pid] = _kill(pid)
                elif gone:
                    blocking = True  # an exited process whose memory is being released
                elif _ours_to_kill(pid, ownership, foreign_policy):
                    blocking = True
                    cleaned[pid] = _kill(pid, ownership)
                elif holder.used_bytes > tolerance:
                    foreign.append(holder)
        mem_ok = all(s.used_bytes <= baseline.get(s.index, 0) + tolerance for s in states)
        if foreign and not mem_ok and foreign_policy != "wait":
            raise _busy(
                f"GPU(s) {_gpu_text(gpu_list)} held by a process that is not this sweep's "
                f"(release policy {foreign_policy!r})",
                states,
                baseline,
                tolerance,
                now - t0,
                "foreign_holder",
                ownership,
            )
        if mem_ok and not blocking:
            if ok_since is None:
                ok_since = now
            if now - ok_since >= settle:
                return ReleaseResult(
                    seconds=now - t0,
                    polls=polls,
                    cleaned=tuple(cleaned[p] for p in sorted(cleaned)),
                    released_s=ok_since - t0,
                )
        else:
            ok_since = None
        if now - t0 >= timeout:
            raise _busy(
                f"GPU memory on GPU(s) {_gpu_text(gpu_list)} not released within {timeout:g}s "
                f"(tolerance {tolerance / 2**20:.0f} MiB over baseline)",
                states,
                baseline,
                tolerance,
                now - t0,
                "foreign_holder" if foreign else "not_released",
                ownership,
            )
        if cancelled is not None and cancelled():
            raise Interrupted("stopped while waiting for GPU memory")
        time.sleep(delay)
        delay = min(delay * 1.5, _MAX_POLL)


def _gpu_text(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in gpus) or "(all)"


def prepare_gpus(
    probe: GpuProbe,
    gpus: Sequence[int],
    policy: ReleasePolicy,
    *,
    stored: Mapping[int, int] | None = None,
    departing: Iterable[int] = (),
    expected: Mapping[int, int] | None = None,
) -> Prepared:
    """Make the GPUs idle for the sweep and take the baseline the release gate waits for.

    Holders that are servesweep's own (``ownership``: this slot's orphans, an earlier
    dead run's instances of this database; any servesweep instance under ``kill-own``)
    are killed. Other holders using more than ``tolerance``: ``fail``/``kill-own``
    raise ``gpu_busy`` naming them (and their owner when servesweep started them),
    ``wait`` waits up to ``timeout`` for them to exit. Smaller holders are reported
    and become part of the baseline. ``departing``: PIDs of an instance servesweep
    has just stopped (their memory is waited for like the killed ones');
    ``expected``: what the GPUs used beside that instance, read before it was stopped
    (an exited process is no longer listed, so its memory must be known before).

    The baseline is never taken while memory of those is still coming back: with a
    ``stored`` baseline (an earlier run of this sweep on this machine) the GPUs must
    come back to it (``gpu_busy`` after ``timeout`` otherwise), and a lower reading
    lowers it; without one, it is measured once no departing or exited process is
    listed and the readings are stable for ``settle`` seconds.
    """
    tolerance, timeout = policy.tolerance, policy.timeout
    foreign_policy, ownership = policy.foreign_policy, policy.ownership
    gpu_list = list(gpus)
    t0 = time.monotonic()
    holders = check_foreign_holders(probe, gpu_list)
    own = [h for h in holders if _ours_to_kill(h.pid, ownership, foreign_policy)]
    own_pids = {h.pid for h in own}
    big = [h for h in holders if h.pid not in own_pids and h.used_bytes > tolerance]
    if big and foreign_policy != "wait":
        raise _busy(
            f"before the sweep, GPU(s) {_gpu_text(gpu_list)} are held by processes that are "
            f"not this sweep's (release policy {foreign_policy!r}; use 'wait' to wait for them)",
            probe.snapshot(gpu_list),
            {},
            tolerance,
            0.0,
            "foreign_holder",
            ownership,
        )
    leaving = own_pids | {h.pid for h in big} | set(departing)
    # What the GPUs will use once those are gone (measured before anything is killed).
    estimate = {
        s.index: s.used_bytes - sum(h.used_bytes for h in s.holders if h.pid in leaving)
        for s in probe.snapshot(gpu_list)
    }
    cleaned = tuple(_kill(pid, ownership) for pid in sorted(own_pids))
    _wait_exit({h.pid for h in big}, probe, gpu_list, tolerance, timeout, ownership)
    target = dict(stored) if stored else estimate
    if not stored and expected:
        target = {g: min(v, expected.get(g, v)) for g, v in target.items()}
    notes: list[str] = []
    if stored:
        missing = [g for g in gpu_list if g not in stored]
        for g in missing:
            target[g] = estimate.get(g, 0)
    wait_released(
        probe,
        gpu_list,
        target,
        dataclasses.replace(
            policy, timeout=max(0.0, timeout - (time.monotonic() - t0)), foreign_policy="wait"
        ),
        old_pids=leaving,
    )
    measured = _stable_reading(
        probe, gpu_list, tolerance, policy.settle, timeout - (time.monotonic() - t0)
    )
    if stored:
        baseline = {g: min(target[g], measured.get(g, target[g])) for g in gpu_list}
        lowered = [g for g in gpu_list if baseline[g] < target[g]]
        if lowered:
            notes.append(
                "GPU(s) " + _gpu_text(lowered) + " use less memory than when the sweep began; "
                "the baseline follows them down"
            )
        source = "stored"
    else:
        baseline = measured
        source = "measured"
    return Prepared(
        baseline=baseline,
        holders=tuple(holders),
        cleaned=cleaned,
        waited_s=time.monotonic() - t0,
        source=source,
        notes=tuple(notes),
    )


def _stable_reading(
    probe: GpuProbe, gpus: list[int], tolerance: int, settle: float, timeout: float
) -> dict[int, int]:
    """Used bytes per GPU once no exited process is listed as a holder and the readings
    have moved less than ``tolerance`` for ``settle`` seconds (the last reading)."""
    t0 = time.monotonic()
    delay = _FIRST_POLL
    first: dict[int, int] | None = None
    since = t0
    while True:
        states = probe.snapshot(gpus)
        now = time.monotonic()
        reading = {s.index: s.used_bytes for s in states}
        dying = any(procs.is_gone(h.pid) for s in states for h in s.holders)
        if (
            dying
            or first is None
            or any(abs(reading[g] - first.get(g, reading[g])) > tolerance for g in reading)
        ):
            first, since = (None if dying else reading), now
        elif now - since >= settle:
            return reading
        if now - t0 >= max(timeout, settle):
            if dying:
                raise _busy(
                    f"GPU(s) {_gpu_text(gpus)} still list exited processes after "
                    f"{max(timeout, settle):g}s: their memory is not back, so no baseline "
                    "can be taken",
                    states,
                    {},
                    tolerance,
                    now - t0,
                    "not_released",
                )
            return reading
        time.sleep(delay)
        delay = min(delay * 1.5, _MAX_POLL)


def _wait_exit(
    pids: set[int],
    probe: GpuProbe,
    gpus: list[int],
    tolerance: int,
    timeout: float,
    ownership: Ownership | None = None,
) -> None:
    """Wait (never kill) until foreign processes have exited."""
    t0 = time.monotonic()
    delay = _FIRST_POLL
    while any(not procs.is_gone(pid) for pid in pids):
        if time.monotonic() - t0 >= timeout:
            raise _busy(
                f"GPU(s) {_gpu_text(gpus)} still held by processes that are not this sweep's "
                f"after waiting {timeout:g}s",
                probe.snapshot(gpus),
                {},
                tolerance,
                time.monotonic() - t0,
                "foreign_holder",
                ownership,
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
