"""The pure parts of sweeps on a cluster: version and input checks, how nodes are
named and numbered, how a node sees the sweep, the event buffer, lost-node evidence,
errors that travel between nodes, and the ``executor`` section of a sweep file."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from servesweep.errors import BenchError, ConfigError, DatasetError, ServesweepError, TrialFailed
from servesweep.models import Evidence, FailureClass
from servesweep.spec.load import load_sweep_text
from servesweep.sweep.events import SweepWarning
from servesweep.sweep.executors.ray.nodes import (
    BufferChannel,
    RemoteFailure,
    check_fit,
    check_ray_version,
    cluster_spec,
    gpu_ids,
    gpu_nodes,
    lost_evidence,
    node_context,
    node_infos,
    short_error,
    trial_needs,
)
from servesweep.sweep.slots.data import NodeInfo, SweepContext

_SWEEP = """
name: c
server:
  engine: sim
{server}
params:
  grid:
    tp: [1, 2]
workloads:
  - name: chat
    concurrency: [1]
    requests: 2
{extra}
"""


def _spec(server: str = "", extra: str = "") -> Any:
    return load_sweep_text(_SWEEP.format(server=server, extra=extra)).spec


def _node(node_id: str, host: str, ip: str, gpus: float = 2, alive: bool = True) -> dict[str, Any]:
    return {
        "NodeID": node_id,
        "NodeManagerHostname": host,
        "NodeManagerAddress": ip,
        "Alive": alive,
        "Resources": {"CPU": 4.0, "GPU": gpus} if gpus else {"CPU": 4.0},
    }


def test_ray_versions_older_than_the_tested_floor_are_refused_in_one_line() -> None:
    check_ray_version("2.60.0")
    check_ray_version("2.61.1rc0")
    check_ray_version("3.0.0")
    with pytest.raises(ConfigError, match=r"Ray 2\.9\.3 is too old: servesweep needs ray>=2\.60"):
        check_ray_version("2.9.3")
    with pytest.raises(ConfigError, match="cannot read the Ray version"):
        check_ray_version("nightly")
    with pytest.raises(ConfigError) as caught:
        check_ray_version("2.59.9")
    assert "\n" not in str(caught.value)


def test_only_alive_nodes_with_gpus_can_run_trials() -> None:
    raw = [
        _node("c", "h2", "10.0.0.3"),
        _node("a", "h1", "10.0.0.1", gpus=0),
        _node("b", "h3", "10.0.0.2", gpus=4),
        _node("d", "h4", "10.0.0.4", alive=False),
    ]
    nodes = gpu_nodes(raw)
    assert [(n.node_id, n.gpus) for n in nodes] == [("b", 4), ("c", 2)]


def test_nodes_are_named_by_hostname_and_by_address_when_hostnames_repeat() -> None:
    raw = gpu_nodes(
        [
            _node("n1", "gpu-a", "10.0.0.1"),
            _node("n2", "box", "10.0.0.2"),
            _node("n3", "box", "10.0.0.3"),
            _node("n4aaaaaaaa", "twin", "10.0.0.9"),
            _node("n5bbbbbbbb", "twin", "10.0.0.9"),
        ]
    )
    gpus = {n.node_id: (0, 1) for n in raw}
    names = {n.node_id: n.name for n in node_infos(raw, gpus)}
    assert names == {
        "n1": "gpu-a",
        "n2": "10.0.0.2",
        "n3": "10.0.0.3",
        "n4aaaaaaaa": "10.0.0.9#n4aaaaaa",
        "n5bbbbbbbb": "10.0.0.9#n5bbbbbb",
    }
    assert len(set(names.values())) == len(names)
    assert {n.key for n in node_infos(raw, gpus)} == set(names)


def test_gpu_indexes_follow_the_nodes_visible_devices() -> None:
    assert gpu_ids(2, None) == (0, 1)
    assert gpu_ids(2, "") == (0, 1)
    assert gpu_ids(2, "4,5,6") == (4, 5)
    with pytest.raises(ConfigError, match="UUID"):
        gpu_ids(1, "GPU-3f2a")


def _context(spec: Any) -> SweepContext:
    return SweepContext(
        spec=spec,
        sweep_id=1,
        store_id="s",
        store_path="/r/db",
        run="r1",
        log_root="/r/runs",
        fake_gpu_dir="/driver/gpus",
    )


def test_a_node_binds_its_own_address_and_uses_its_own_fake_gpus() -> None:
    context = _context(_spec())
    seen = node_context(context, ip="10.0.0.7", fake_gpu_dir="/node/gpus", bind_node_address=True)
    assert seen.spec.server.host == "10.0.0.7"
    assert seen.fake_gpu_dir == "/node/gpus"
    kept = node_context(context, ip="10.0.0.7", fake_gpu_dir=None, bind_node_address=False)
    assert kept.spec.server.host == "127.0.0.1"
    assert kept.fake_gpu_dir == "/driver/gpus"
    assert context.spec.server.host == "127.0.0.1", "the driver's context is unchanged"


def test_the_buffer_hands_over_events_in_order_and_wakes_a_waiting_reader() -> None:
    channel = BufferChannel()
    assert channel.take(0) == []
    first, second = SweepWarning(message="a"), SweepWarning(message="b")
    channel.send(first)
    channel.send(second)
    assert channel.take(10) == [first, second]
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(channel.take(30)))
    reader.start()
    time.sleep(0.05)
    channel.send(first)
    reader.join(timeout=10)
    assert got == [[first]]
    # wake() makes a waiting reader return with nothing: woken again until it does (a
    # wake before the reader waits is lost), well before its own 30 s
    start = time.monotonic()
    reader = threading.Thread(target=lambda: got.append(channel.take(30)))
    reader.start()
    while reader.is_alive() and time.monotonic() - start < 10:
        channel.wake()
        reader.join(timeout=0.05)
    assert not reader.is_alive() and got[-1] == []


def test_a_lost_node_is_told_with_what_the_cluster_said() -> None:
    ray_said = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: SlotActor\n"
        "\tactor_id: 78051ca7\n\tpid: 9764\n\tip: 10.0.0.3\nThe actor died because its node "
        "has died. Node Id: f158\n\tthe actor's node was terminated unexpectedly"
    )
    node = NodeInfo("gpu-b", (0, 1), "f158")
    evidence = lost_evidence(node, 1, 7, ray_said, dead=True)
    assert evidence.reason == "node_died"
    assert evidence.message.startswith("trial 7: node gpu-b was lost (")
    assert "class_name" not in evidence.message and "node has died" in evidence.message
    assert evidence.details["node_id"] == "f158" and evidence.details["slot"] == 1
    assert evidence.details["cluster_error"] == ray_said
    alive = lost_evidence(node, 0, 7, "worker died", dead=False)
    assert alive.reason == "slot_process_died"
    assert "the slot's process on node gpu-b" in alive.message
    assert short_error("a\n\n  pid: 3\nb") == "a b"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (DatasetError("prompts.jsonl:3: not JSON"), DatasetError),
        (BenchError("no server"), BenchError),
        (ConfigError("bad", key="server.port"), ConfigError),
        (ServesweepError("plain"), ServesweepError),
    ],
)
def test_errors_from_another_node_are_raised_again_as_themselves(
    exc: ServesweepError, kind: type[ServesweepError]
) -> None:
    again = RemoteFailure.of(exc).error("node b")
    assert type(again) is kind
    assert str(again).endswith(str(exc)) and "node b" in str(again)


def test_a_trial_failure_and_a_bug_from_another_node_keep_what_they_say() -> None:
    evidence = Evidence(message="no GPUs", reason="held")
    again = RemoteFailure.of(TrialFailed(FailureClass.GPU_BUSY, evidence)).error("x")
    assert isinstance(again, TrialFailed)
    assert again.failure_class is FailureClass.GPU_BUSY and again.evidence == evidence
    try:
        raise KeyError("boom")
    except KeyError as bug:
        failure = RemoteFailure.of(bug)
    assert failure.kind == "internal" and "Traceback" in failure.message
    bug = failure.error("node b")
    assert type(bug) is RuntimeError and str(bug) == "node b: KeyError: 'boom'"
    if sys.version_info >= (3, 11):
        assert bug.__notes__ == [failure.message]


def test_the_gpu_pool_on_a_cluster_is_the_largest_nodes() -> None:
    spec = _spec("  gpus: [0]\n  gpus_per_trial: 1")
    nodes = [NodeInfo("a", (0, 1), "A"), NodeInfo("b", (0, 1, 2, 3), "B")]
    assert cluster_spec(spec, nodes).server.gpus == [0, 1, 2, 3]
    assert cluster_spec(spec, []).server.gpus == [0]


def test_some_configuration_must_fit_on_some_node() -> None:
    nodes = [NodeInfo("a", (0, 1), "A"), NodeInfo("b", (0, 1, 2, 3), "B")]
    configs = [{"tp": 1}, {"tp": 2}]
    expr = _spec('  gpus_per_trial: "{param.tp} * 2"')
    assert trial_needs(expr, configs, nodes) == {"tp=1": 2, "tp=2": 4}
    assert check_fit(trial_needs(expr, configs, nodes), nodes, "h:1") == []
    # a configuration that fits on no node is skipped (a warning), not the whole sweep
    assert check_fit({"tp=1": 2, "tp=4": 8}, nodes, "h:1") == [
        "tp=4 needs 8 GPUs, but no node of the Ray cluster at h:1 has that many (largest: b "
        "with 4): skipped"
    ]
    # none fits: the sweep cannot run
    fixed = _spec("  gpus_per_trial: 8")
    with pytest.raises(ConfigError) as caught:
        check_fit(trial_needs(fixed, configs, nodes), nodes, "h:1")
    assert str(caught.value) == (
        "server.gpus_per_trial: tp=1 needs 8 GPUs, but no node of the Ray cluster at h:1 "
        "has that many (largest: b with 4)"
    )
    whole = _spec()
    assert trial_needs(whole, configs, nodes) == {"tp=1": 4, "tp=2": 4}
    with pytest.raises(ConfigError, match="no alive node with GPUs"):
        check_fit({"tp=1": 1}, [], "h:1")


def test_the_executor_section_is_checked_with_file_and_line() -> None:
    spec = _spec(extra="executor:\n  kind: ray\n  address: 10.0.0.1:6379\n  bench_from: driver")
    assert spec.executor.kind == "ray" and spec.executor.bench_from == "driver"
    assert _spec().executor.kind == "local"
    for extra, message in [
        ("executor:\n  address: 10.0.0.1:6379", "set 'kind: ray'"),
        ("executor:\n  kind: slurm", "executor.kind"),
        ("executor:\n  kind: ray\n  bench_from: laptop", "executor.bench_from"),
    ]:
        with pytest.raises(ConfigError) as caught:
            _spec(extra=extra)
        text = str(caught.value)
        assert message in text and "\n" not in text, text
        assert text.startswith("<string>:"), text


def test_without_ray_installed_a_ray_sweep_is_one_line_of_advice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from servesweep.sweep.executors.site import join_cluster

    monkeypatch.setitem(sys.modules, "ray", None)
    for name in (
        "servesweep.sweep.executors.ray.executor",
        "servesweep.sweep.executors.ray.handle",
        "servesweep.sweep.executors.ray.actor",
    ):
        monkeypatch.delitem(sys.modules, name, raising=False)
    loaded = load_sweep_text(_SWEEP.format(server="", extra="executor:\n  kind: ray"))
    with pytest.raises(ConfigError) as caught:
        join_cluster(loaded, None)
    assert "Ray is not installed: pip install 'servesweep[ray]'" in str(caught.value)
    assert "executor.kind" in str(caught.value)
    with pytest.raises(ConfigError, match=r"--ray: Ray is not installed"):
        join_cluster(load_sweep_text(_SWEEP.format(server="", extra="")), "")
    assert join_cluster(load_sweep_text(_SWEEP.format(server="", extra="")), None) is None


def test_a_long_cluster_error_is_cut_after_a_whole_word() -> None:
    said = "The actor died because its node has died. " + "the actor's node was terminated " * 9
    short = short_error(said, 200)
    assert len(short) <= 200 and short.endswith("...")
    assert short[:-3].split(" ")[-1] in said.split(" "), short  # no word cut in two
    assert short_error("short enough", 200) == "short enough"


def test_status_knows_a_cluster_node_started_on_this_machine() -> None:
    import socket

    from servesweep.sweep.commands.status import _on_this_machine

    assert _on_this_machine(socket.gethostname()) and _on_this_machine("")
    # the test cluster's nodes (and any node on a loopback address) run here
    assert _on_this_machine("127.0.0.3") and _on_this_machine("127.0.0.2#0a1b2c3d")
    assert not _on_this_machine("gpu-node-7.example") and not _on_this_machine("192.0.2.7")


def test_server_gpus_is_said_unused_on_a_cluster_even_when_it_matches_a_node() -> None:
    from servesweep.sweep.executors.ray.nodes import check_cluster

    # the quickstart's gpus: [0, 1], on a cluster whose largest node has GPUs 0 and 1
    context = _context(_spec("  gpus: [0, 1]\n  gpus_per_trial: 1"))
    nodes = [NodeInfo("a", (0, 1), "A"), NodeInfo("b", (0, 1), "B")]
    seen = check_cluster(context.spec, nodes, "10.0.0.1:6379")
    assert seen == [
        "server.gpus [0, 1] is not used on a Ray cluster: each node's GPUs are those Ray "
        "offers there"
    ]
