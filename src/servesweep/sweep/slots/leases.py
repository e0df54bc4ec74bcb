"""The run's leases: its slots' ports and its GPU pool, on every machine it uses, held
from before anything starts until the run ends (see ``servers.leases``).

Here (:func:`run_leases`) the run's own process holds them; on a Ray cluster a small
actor on each node does (``sweep.executors.ray.site.hold_node_leases``), and Ray ends it with
the run. A second
run that needs a leased port or GPU is refused with one line naming the holder
(:class:`~servesweep.errors.ResourceBusy`), or, with ``--wait``, waits for it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from servesweep.errors import ResourceBusy, StoreError
from servesweep.servers.leases import Busy, Holder, Lease, resources_for
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import slot_ports

__all__ = ["busy_message", "run_leases", "waiting_message"]


def busy_message(busy: Busy, node: str = "") -> str:
    """One line: what is held, by whom, and what to do."""
    where = f" on node {node}" if node else ""
    if busy.resource.kind == "port":
        other = "run on another port with --port N"
    else:
        other = "choose other GPUs (server.gpus)"
    return (
        f"{busy.resource.label}{where} is held by {busy.holder.describe()}; wait for it "
        f"with `servesweep run --wait`, or {other}"
    )


def waiting_message(busy: Busy, node: str = "") -> str:
    where = f" on node {node}" if node else ""
    return f"waiting for {busy.resource.label}{where}, held by {busy.holder.describe()} (--wait)"


def owner_of(spec: SweepSpec, store_path: Path) -> Holder:
    """How this run names itself to others."""
    return Holder(
        pid=os.getpid(),
        sweep=spec.name,
        store=str(store_path.resolve()),
        host=socket.gethostname(),
    )


@contextmanager
def run_leases(
    spec: SweepSpec,
    store_path: Path,
    *,
    slots: int,
    fake_gpu_dir: str | None,
    wait: bool,
    notify: Callable[[str], None],
) -> Iterator[None]:
    """Hold the leases of this run on this machine (``slots`` slots) while the block
    runs. ResourceBusy when another run holds one and ``wait`` is False; ``notify``
    gets the one-line status while waiting."""
    owner = owner_of(spec, store_path)
    ports = slot_ports(spec, slots)
    lease = Lease(owner)
    server = spec.server
    resources = resources_for(ports, server.gpus, server.gpu_backend, fake_gpu_dir, server.host)
    try:
        try:
            if wait:
                lease.wait_take(resources, lambda busy: notify(waiting_message(busy)))
            else:
                busy = lease.take(resources)
                if busy is not None:
                    raise ResourceBusy(busy_message(busy))
        except OSError as exc:
            raise StoreError(
                f"cannot take the run's leases in {lease.directory}: {exc.strerror or exc}; "
                "set SERVESWEEP_LEASE_DIR to a writable directory shared by the machine's runs"
            ) from exc
        yield
    finally:
        lease.release()
