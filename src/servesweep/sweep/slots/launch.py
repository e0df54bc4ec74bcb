"""How a configuration starts on a slot, built in one place: the slot's view of the
server section (its port, GPUs and systemd unit instance), the command line and
environment (:func:`launch_for`) and the launch fingerprint that adoption compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.models import fingerprint
from servesweep.servers.engines import build_launch
from servesweep.servers.gpu import FAKE_GPUS_ENV
from servesweep.spec.schema import ServerSpec
from servesweep.sweep.slots.data import Placement, SweepContext

__all__ = ["Launch", "launch_fingerprint", "launch_for", "slot_server"]


def slot_server(server: ServerSpec, placement: Placement) -> ServerSpec:
    """The sweep's server section as one slot sees it: its port and GPUs, and a
    systemd unit template (``name@.service``) instantiated with the slot number."""
    update: dict[str, Any] = {"port": placement.port, "gpus": list(placement.gpus)}
    if server.systemd is not None and "@." in server.systemd.unit:
        unit = server.systemd.unit.replace("@.", f"@{placement.slot}.", 1)
        update["systemd"] = server.systemd.model_copy(update={"unit": unit})
    return server.model_copy(update=update)


def launch_fingerprint(server: ServerSpec, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """What makes two instances the same measurement target: the exact command line and
    environment, the launcher and what it runs in. Adoption requires it to be equal."""
    launcher: dict[str, Any] = {"kind": server.launcher}
    if server.systemd is not None:
        launcher["unit"] = server.systemd.unit
    if server.docker is not None:
        launcher["docker"] = server.docker.model_dump()
    if server.commands is not None:
        launcher["commands"] = server.commands.model_dump()
    return fingerprint({"argv": list(argv), "env": dict(env), "launcher": launcher})


@dataclass(frozen=True)
class Launch:
    """How a configuration starts on a slot: its command line, its environment and the
    launch fingerprint (what adoption compares)."""

    argv: list[str]
    env: dict[str, str]
    fingerprint: str


def launch_for(
    context: SweepContext,
    placement: Placement,
    params: Mapping[str, Any],
    *,
    trial: str | None = None,
    log: str | None = None,
) -> Launch:
    """The launch of a configuration on a slot: the one place it is built.

    ``trial`` (the trial's key) and ``log`` fill a command template's ``{trial}``,
    ``{log}`` and ``{pid_file}``; left out, the template keeps its placeholders (the
    launch of no trial in particular). The fingerprint always leaves them out, so an
    instance started for one trial is recognised as the same launch by another."""
    server = slot_server(context.spec.server, placement)
    extra = {FAKE_GPUS_ENV: context.fake_gpu_dir} if context.fake_gpu_dir else {}

    def build(trial: str, log: str) -> tuple[list[str], dict[str, str]]:
        argv, env = build_launch(server, params, trial=trial, log=log)
        return argv, {**extra, **env}

    # the same launch for any trial: the template's own placeholders stand for them
    plain = build("{trial}", "{log}")
    fp = launch_fingerprint(server, *plain)
    argv, env = plain if trial is None and log is None else build(trial or "", log or "")
    return Launch(argv, env, fp)
