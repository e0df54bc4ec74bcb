"""Leases (servers.leases): all or none, the holder named, a port number shared by two
addresses, fake GPUs of two directories apart. (A killed run's leases being free at
once: tests/integration/test_sweep_leases.py.)"""

from __future__ import annotations

from pathlib import Path

from servesweep.servers.leases import Holder, Lease, gpu_resources, port_resource


def _lease(tmp_path: Path, pid: int, sweep: str) -> Lease:
    return Lease(Holder(pid=pid, sweep=sweep, store=f"/r/{sweep}.db", host="h"), tmp_path)


def test_all_or_none_and_the_holder_is_named(tmp_path: Path) -> None:
    first, second = _lease(tmp_path, 11, "a"), _lease(tmp_path, 22, "b")
    assert first.take([port_resource(9000), *gpu_resources([0], None)]) is None
    busy = second.take([port_resource(9001), *gpu_resources([0], None)])
    assert busy is not None and busy.resource.label == "GPU 0"
    assert busy.holder.describe() == "sweep 'a' (results /r/a.db, servesweep pid 11 on h)"
    # nothing of the refused set was kept: port 9001 is free for a third run
    assert _lease(tmp_path, 33, "c").take([port_resource(9001)]) is None
    first.release()
    assert second.take([*gpu_resources([0], None)]) is None
    second.release()


def test_addresses_share_a_port_number_and_every_address_takes_it_whole(tmp_path: Path) -> None:
    node2, node3 = _lease(tmp_path, 1, "n2"), _lease(tmp_path, 1, "n3")
    assert node2.take([port_resource(9000, "127.0.0.2")]) is None
    assert node3.take([port_resource(9000, "127.0.0.3")]) is None
    again = _lease(tmp_path, 2, "x").take([port_resource(9000, "127.0.0.2")])
    assert again is not None and again.holder.sweep == "n2"
    assert _lease(tmp_path, 3, "y").take([port_resource(9000, "0.0.0.0")]) is not None
    node2.release()
    node3.release()
    assert _lease(tmp_path, 3, "y").take([port_resource(9000, "0.0.0.0")]) is None


def test_fake_gpus_of_two_directories_are_two_gpus(tmp_path: Path) -> None:
    one = _lease(tmp_path, 1, "a")
    assert one.take(gpu_resources([0], str(tmp_path / "g1"))) is None
    assert _lease(tmp_path, 2, "b").take(gpu_resources([0], str(tmp_path / "g2"))) is None
    assert _lease(tmp_path, 2, "b").take(gpu_resources([0], str(tmp_path / "g1"))) is not None
