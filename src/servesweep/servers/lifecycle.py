"""One facade for the trial runner: one method per lifecycle phase.

``prepare`` (before the sweep) → per trial ``stop`` → ``release`` → ``start`` →
``wait_ready`` → (workloads, with ``check_alive``). Every method raises
``TrialFailed`` with evidence when its phase fails; the runner stores it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from servesweep.errors import TrialFailed
from servesweep.models import Evidence, FailureClass, GpuHolder, InstanceRecord, ProcessInfo
from servesweep.servers import logs, ports, procs
from servesweep.servers.engines import EnginePreset
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.launchers.base import Launcher, LaunchRequest, StopResult
from servesweep.servers.readiness import ProgressCallback, ReadyInfo, wait_ready
from servesweep.servers.release import (
    ReleaseResult,
    prepare_gpus,
    stop_instance,
    wait_released,
)
from servesweep.spec.schema import ServerSpec

__all__ = ["ServerLifecycle", "sweep_tag_prefix"]

_LOG_CATCHUP = 5.0
"""How long a dead instance's log may take to catch up with its exit (a journal)."""


def sweep_tag_prefix(trial_key: str) -> str:
    """The tag prefix shared by every instance of one sweep: ``<sweep>-`` from a
    trial key ``<sweep>-<trial id>`` (the key itself plus ``-`` otherwise)."""
    head, sep, tail = trial_key.rpartition("-")
    if sep and tail.isdigit() and head:
        return f"{head}-"
    return f"{trial_key}-"


class ServerLifecycle:
    """The lifecycle of one server slot (one port, one set of GPUs).

    ``baseline`` is the used memory per GPU that ``release`` waits for; ``prepare``
    measures it. A runner that adopts a running instance instead of calling
    ``prepare`` should set it from the stored value (a GPU without one has baseline 0).
    ``own_tag_prefix``: instances whose tag starts with it are servesweep's own — their
    orphans are killed by the release gate. When None it is derived from each
    ``start``'s trial key (``<sweep>-<trial id>`` gives ``<sweep>-``).
    """

    def __init__(
        self,
        spec: ServerSpec,
        preset: EnginePreset,
        launcher: Launcher,
        probe: GpuProbe,
        *,
        own_tag_prefix: str | None = None,
    ) -> None:
        self.spec = spec
        self.preset = preset
        self.launcher = launcher
        self.probe = probe
        self.own_tag_prefix = own_tag_prefix
        self._explicit_prefix = own_tag_prefix is not None
        self.baseline: dict[int, int] = {}
        self.foreign_holders: tuple[GpuHolder, ...] = ()
        self.cleaned: tuple[ProcessInfo, ...] = ()

    def _uses_gpus(self, gpus: Sequence[int]) -> bool:
        return bool(gpus) and self.probe.name != "none"

    def prepare(self, gpus: Sequence[int]) -> dict[int, int]:
        """Check for foreign GPU holders (per ``server.release.foreign_holders``) and
        measure the baseline; returns it (also kept in ``self.baseline``)."""
        if not self._uses_gpus(gpus):
            return {}
        rel = self.spec.release
        prepared = prepare_gpus(
            self.probe,
            gpus,
            tolerance=rel.tolerance,
            settle=rel.settle,
            timeout=self.spec.timeouts.release,
            foreign_policy=rel.foreign_holders,
            own_tag_prefix=self.own_tag_prefix,
        )
        self.baseline = dict(prepared.baseline)
        self.foreign_holders = prepared.holders
        self.cleaned = prepared.cleaned
        return dict(self.baseline)

    def stop(self, instance: InstanceRecord) -> StopResult:
        """Stop the whole instance; ``stop_failed`` naming the survivors."""
        return stop_instance(self.launcher, instance, self.spec.timeouts)

    def release(self, gpus: Sequence[int], old_pids: set[int]) -> ReleaseResult:
        """Wait until the old instance's GPU memory is back; ``gpu_busy`` naming holders."""
        if not self._uses_gpus(gpus):
            return ReleaseResult(seconds=0.0, polls=0)
        rel = self.spec.release
        return wait_released(
            self.probe,
            gpus,
            self.baseline,
            old_pids=set(old_pids),
            tolerance=rel.tolerance,
            settle=rel.settle,
            timeout=self.spec.timeouts.release,
            foreign_policy=rel.foreign_holders,
            own_tag_prefix=self.own_tag_prefix,
        )

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: str | os.PathLike[str],
        trial_key: str,
        fingerprint: str,
    ) -> InstanceRecord:
        """Refuse a port that another program listens on (``port_in_use``), then start."""
        if not self._explicit_prefix:
            self.own_tag_prefix = sweep_tag_prefix(trial_key)
        self._clean_own_listeners()
        ports.check_port_free(self.spec.host, self.spec.port, ours=set())
        request = LaunchRequest(
            argv=list(argv),
            env=dict(env),
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
        prefix = self.own_tag_prefix
        kill_any = self.spec.release.foreign_holders == "kill-own"
        own = []
        for info in ports.listeners(self.spec.host, self.spec.port):
            tag = procs.tag_of(info.pid) if info.pid > 0 else None
            if tag is not None and (kill_any or (prefix is not None and tag.startswith(prefix))):
                own.append(info.pid)
        if own:
            procs.signal_all(own, signal.SIGKILL)
            procs.wait_gone(own, self.spec.timeouts.kill)

    def wait_ready(
        self, instance: InstanceRecord, on_progress: ProgressCallback | None = None
    ) -> ReadyInfo:
        """Block until the new instance generates (see ``readiness``)."""
        api_key = os.environ.get(self.spec.api_key_env) if self.spec.api_key_env else None
        return wait_ready(
            self.launcher,
            instance,
            self.preset,
            host=self.spec.host,
            port=instance.port or self.spec.port,
            model=self.spec.served_model_name,
            deadline_s=self.spec.timeouts.ready,
            api_key=api_key,
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
                log_tail=tail,
                log_path=instance.log_path,
            ),
        )
