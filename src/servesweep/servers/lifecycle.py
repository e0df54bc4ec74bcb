"""One facade for the trial runner: one method per lifecycle phase.

``prepare`` (before the sweep) → per trial ``stop`` → ``release`` → ``start`` →
``wait_ready`` → (workloads, with ``check_alive``). Every method raises
``TrialFailed`` with evidence when its phase fails; the runner stores it.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from servesweep.errors import TrialFailed
from servesweep.models import Evidence, FailureClass, GpuHolder, InstanceRecord, ProcessInfo
from servesweep.servers import logs, ports, procs
from servesweep.servers.engines import EnginePreset
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.launchers.base import Launcher, LaunchRequest, StopResult
from servesweep.servers.ownership import OwnerKind, Ownership, owner_env
from servesweep.servers.readiness import ProgressCallback, ReadyInfo, wait_ready
from servesweep.servers.release import (
    ReleasePolicy,
    ReleaseResult,
    prepare_gpus,
    stop_instance,
    wait_released,
)
from servesweep.spec.schema import ServerSpec

__all__ = ["ServerLifecycle"]

_LOG_CATCHUP = 5.0
"""How long a dead instance's log may take to catch up with its exit (a journal)."""


class ServerLifecycle:
    """The lifecycle of one server slot (one port, one set of GPUs).

    ``baseline`` is the used memory per GPU that ``release`` waits for; ``prepare``
    takes it (reusing a stored one when given). ``ownership`` says which processes are
    this slot's own (see ``servers.ownership``): their orphans are killed by the
    release gate and an orphan of ours holding the port is ended before a start;
    everything else is never signalled (but under the ``kill-own`` policy). Every
    instance ``start`` launches carries this ownership in its environment. Without
    one, the lifecycle makes its own (a private run: what it starts is its own).
    ``api_key`` is the key the readiness gate sends (read once, where the run started,
    from ``server.api_key_env``: the machine the slot runs on may not have it).
    """

    def __init__(
        self,
        spec: ServerSpec,
        preset: EnginePreset,
        launcher: Launcher,
        probe: GpuProbe,
        *,
        ownership: Ownership | None = None,
        store_path: str = "",
        api_key: str | None = None,
    ) -> None:
        self.spec = spec
        self.preset = preset
        self.launcher = launcher
        self.probe = probe
        self.ownership = ownership or Ownership(
            f"private-{secrets.token_hex(6)}", f"{os.getpid()}-{secrets.token_hex(3)}", 0
        )
        self.store_path = store_path
        self.api_key = api_key
        self.baseline: dict[int, int] = {}
        self.foreign_holders: tuple[GpuHolder, ...] = ()
        self.cleaned: tuple[ProcessInfo, ...] = ()
        self.baseline_source = "measured"
        self.baseline_notes: tuple[str, ...] = ()

    def _uses_gpus(self, gpus: Sequence[int]) -> bool:
        return bool(gpus) and self.probe.name != "none"

    def prepare(
        self,
        gpus: Sequence[int],
        *,
        stored: Mapping[int, int] | None = None,
        departing: Iterable[int] = (),
        expected: Mapping[int, int] | None = None,
    ) -> dict[int, int]:
        """Make the GPUs idle (our own leftovers killed, foreign holders per
        ``server.release.foreign_holders``, ``departing`` PIDs' memory back) and take
        the baseline, or reuse ``stored`` (see ``release.prepare_gpus``); returns it
        (also kept in ``self.baseline``)."""
        if not self._uses_gpus(gpus):
            return {}
        prepared = prepare_gpus(
            self.probe,
            gpus,
            self._release_policy(),
            stored=stored,
            departing=departing,
            expected=expected,
        )
        self.baseline = dict(prepared.baseline)
        self.foreign_holders = prepared.holders
        self.cleaned = prepared.cleaned
        self.baseline_source = prepared.source
        self.baseline_notes = prepared.notes
        return dict(self.baseline)

    def stop(self, instance: InstanceRecord) -> StopResult:
        """Stop the whole instance; ``stop_failed`` naming the survivors."""
        return stop_instance(self.launcher, instance, self.spec.timeouts)

    def release(
        self,
        gpus: Sequence[int],
        old_pids: set[int],
        cancelled: Callable[[], bool] | None = None,
    ) -> ReleaseResult:
        """Wait until the old instance's GPU memory is back; ``gpu_busy`` naming holders."""
        if not self._uses_gpus(gpus):
            return ReleaseResult(seconds=0.0, polls=0)
        return wait_released(
            self.probe,
            gpus,
            self.baseline,
            self._release_policy(),
            old_pids=set(old_pids),
            cancelled=cancelled,
        )

    def _release_policy(self) -> ReleasePolicy:
        return ReleasePolicy.of(self.spec.release, self.spec.timeouts, self.ownership)

    def owner_env(self) -> dict[str, str]:
        """The environment that marks an instance as this slot's (see ``ownership``)."""
        own = self.ownership
        return owner_env(own.store_id, own.run, int(own.slot), self.store_path)

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: str | os.PathLike[str],
        trial_key: str,
        fingerprint: str,
    ) -> InstanceRecord:
        """Refuse a port that another program listens on (``port_in_use``, naming its
        owner when a servesweep run started it), then start."""
        self._clean_own_listeners()
        try:
            ports.check_port_free(self.spec.host, self.spec.port, ours=set())
        except TrialFailed as failure:
            raise self._name_port_owner(failure) from None
        request = LaunchRequest(
            argv=list(argv),
            env={**env, **self.owner_env()},
            host=self.spec.host,
            port=self.spec.port,
            gpus=tuple(self.spec.gpus),
            log_path=Path(log_path),
            trial_key=trial_key,
            fingerprint=fingerprint,
        )
        return self.launcher.start(request)

    def launch_command(self, argv: Sequence[str], env: Mapping[str, str]) -> str:
        """The command a user can copy to start this configuration by hand, as this
        slot's launcher would run it (``docker run ...`` for containers)."""
        request = LaunchRequest(
            argv=list(argv),
            env=dict(env),
            host=self.spec.host,
            port=self.spec.port,
            gpus=tuple(self.spec.gpus),
            log_path=Path("server.log"),
            trial_key="manual",
            fingerprint="",
        )
        return self.launcher.launch_command(request)

    def _clean_own_listeners(self) -> None:
        """An orphan of our own earlier instance that kept the listening socket is ours
        to end; anything else on the port is reported by the port check."""
        kill_any = self.spec.release.foreign_holders == "kill-own"
        own = [
            info.pid
            for info in ports.listeners(self.spec.host, self.spec.port)
            if info.pid > 0 and self.ownership.may_kill(info.pid, kill_any_servesweep=kill_any)
        ]
        if own:
            procs.signal_all(own, signal.SIGKILL)
            procs.wait_gone(own, self.spec.timeouts.kill)

    def _name_port_owner(self, failure: TrialFailed) -> TrialFailed:
        """``port_in_use`` that says which servesweep run listens there, when one does."""
        notes = []
        for info in ports.listeners(self.spec.host, self.spec.port):
            if info.pid > 0:
                owner = self.ownership.owner(info.pid)
                if owner.kind is not OwnerKind.FOREIGN:
                    notes.append(f"pid {info.pid} is {owner.describe()}")
        if not notes:
            return failure
        evidence = failure.evidence
        return TrialFailed(
            failure.failure_class,
            replace(
                evidence,
                message=f"{evidence.message}; {'; '.join(notes)}",
                details={**evidence.details, "owners": notes},
            ),
        )

    def wait_ready(
        self, instance: InstanceRecord, on_progress: ProgressCallback | None = None
    ) -> ReadyInfo:
        """Block until the new instance generates (see ``readiness``)."""
        try:
            return self._wait_ready(instance, on_progress)
        except TrialFailed as failure:
            if failure.failure_class is FailureClass.PORT_IN_USE:
                # another program took the port while ours loaded: say whose it is
                raise self._name_port_owner(failure) from None
            raise

    def _wait_ready(
        self,
        instance: InstanceRecord,
        on_progress: ProgressCallback | None,
    ) -> ReadyInfo:
        return wait_ready(
            self.launcher,
            instance,
            self.preset,
            host=self.spec.host,
            port=instance.port or self.spec.port,
            model=self.spec.served_model_name,
            deadline_s=self.spec.timeouts.ready,
            api_key=self.api_key,
            on_progress=on_progress,
        )

    def check_alive(self, instance: InstanceRecord) -> None:
        """``bench_crash`` with the exit status, the log's fatal line and its tail when
        the instance died. The whole log of the instance is searched for the fatal line
        (an engine prints many lines of traceback after the error that killed it)."""
        status = self.launcher.poll(instance)
        if status is None:
            return
        self.launcher.finish_log(instance, _LOG_CATCHUP)
        tail = tuple(self.launcher.log_tail(instance, 40))
        lines = (
            logs.instance_lines(instance.log_path, instance.invocation_id)
            if instance.log_path
            else list(tail)
        )
        match = logs.match_fatal(lines, self.preset.fatal_patterns)
        what = f": the log shows {match.pattern.reason}" if match else ""
        raise TrialFailed(
            FailureClass.BENCH_CRASH,
            Evidence(
                message=f"the server died during the benchmark ({status.describe()}){what}",
                reason=match.pattern.reason if match else "exited",
                exit_code=status.exit_code,
                signal=status.signal,
                matched_line=match.line if match else None,
                first_error_line=logs.first_error(lines, self.preset.error_patterns),
                log_tail=tail,
                log_path=instance.log_path,
            ),
        )
