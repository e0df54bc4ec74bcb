"""Every path in a sweep file is relative to the sweep file, whatever the current
directory: resolved once at load (spec.load.PATH_FIELDS), read by every command."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from servesweep.spec.load import PATH_FIELDS, load_sweep, load_sweep_text
from servesweep.spec.schema import SweepSpec
from servesweep.sweep.commands.run import fake_gpu_dir, store_path_for

SWEEP = """\
name: paths
store: results/sweep.db
server:
  engine: generic
  command: "serve {args}"
  launcher: command
  fake_gpu_dir: gpus
  log_dir: ../logs
  systemd: {unit: x.service, unit_dir: units}
  commands: {start: "serve --pid {pid_file}", pid_file: "run/{trial}.pid"}
workloads:
  - {name: file, dataset: data/prompts.jsonl}
  - {name: home, dataset: ~/prompts.jsonl}
  - {name: builtin, dataset: "builtin:chat"}
  - {name: synth, dataset: synthetic, input_tokens: 8}
  - {name: evals, eval: {suite: suites/tasks.jsonl}}
  - {name: builtin_eval, eval: {suite: "builtin:coding"}}
  - {name: absolute, dataset: /srv/prompts.jsonl}
"""


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sweep file in tmp/project/sweeps/, loaded from tmp/other as the current directory."""
    folder = tmp_path / "project" / "sweeps"
    folder.mkdir(parents=True)
    (folder / "sweep.yaml").write_text(SWEEP)
    cwd = tmp_path / "other"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return folder


def test_every_path_field_is_relative_to_the_sweep_file(elsewhere: Path, tmp_path: Path) -> None:
    loaded = load_sweep(Path("..") / "project" / "sweeps" / "sweep.yaml")
    spec = loaded.spec
    assert loaded.base_dir.is_absolute() and loaded.base_dir.resolve() == elsewhere
    base = loaded.base_dir
    assert spec.store == str(base / "results/sweep.db")
    assert spec.server.fake_gpu_dir == str(base / "gpus")
    assert spec.server.log_dir == str(base / "../logs")
    assert spec.server.systemd is not None and spec.server.systemd.unit_dir == str(base / "units")
    assert spec.server.commands is not None
    assert spec.server.commands.pid_file == str(base / "run/{trial}.pid")
    datasets = {w.name: w.dataset for w in spec.workloads}
    assert datasets["file"] == str(base / "data/prompts.jsonl")
    assert datasets["home"] == str(tmp_path / "home" / "prompts.jsonl")
    assert datasets["builtin"] == "builtin:chat" and datasets["synth"] == "synthetic"
    assert datasets["absolute"] == "/srv/prompts.jsonl"
    suites = {w.name: w.eval.suite for w in spec.workloads if w.eval is not None}
    assert suites == {"evals": str(base / "suites/tasks.jsonl"), "builtin_eval": "builtin:coding"}
    # the text as written is kept (it is what the results database stores)
    assert "log_dir: ../logs" in loaded.text
    assert loaded.resolve("x/y") == base / "x" / "y"


def test_the_commands_helpers_read_the_resolved_paths(elsewhere: Path) -> None:
    loaded = load_sweep(Path("../project/sweeps/sweep.yaml"))
    assert store_path_for(loaded) == loaded.base_dir / "results" / "sweep.db"
    assert store_path_for(loaded, Path("mine.db")) == Path("mine.db")  # --store: as given
    assert fake_gpu_dir(loaded) == str((elsewhere / "gpus").resolve())


def test_default_store_is_beside_the_sweep_file(elsewhere: Path) -> None:
    (elsewhere / "bare.yaml").write_text(
        "name: bare\nserver: {engine: sim}\nworkloads: [{name: a}]\n"
    )
    loaded = load_sweep(Path("../project/sweeps/bare.yaml"))
    assert store_path_for(loaded).resolve() == elsewhere / "servesweep.db"


def test_a_sweep_given_as_text_is_relative_to_the_current_directory(elsewhere: Path) -> None:
    loaded = load_sweep_text(SWEEP)
    assert loaded.base_dir == Path.cwd()
    assert loaded.spec.server.fake_gpu_dir == str(Path.cwd() / "gpus")


def test_the_environment_fake_gpus_are_relative_to_the_current_directory(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (elsewhere / "env.yaml").write_text("name: e\nserver: {engine: sim}\nworkloads: [{name: a}]\n")
    monkeypatch.setenv("SERVESWEEP_FAKE_GPUS", "fake")
    loaded = load_sweep(Path("../project/sweeps/env.yaml"))
    assert fake_gpu_dir(loaded) == str(Path.cwd() / "fake")


def _string_fields(model: type[BaseModel], prefix: str) -> list[str]:
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        tp: Any = field.annotation
        if get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        if get_origin(tp) is list:
            tp, key = get_args(tp)[0], f"{key}.N"
        for member in _models_of(tp):  # a union of models (workload kinds): every member
            out += [f for f in _string_fields(member, f"{key}.") if f not in out]
        if tp is str:
            out.append(key)
    return out


def _models_of(tp: Any) -> list[type[BaseModel]]:
    if get_origin(tp) is Annotated:
        return _models_of(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return [m for a in get_args(tp) for m in _models_of(a)]
    return [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def test_every_field_that_names_a_path_is_resolved() -> None:
    """A new path-like key (``*_dir``, ``*_file``, ``*_path``, a store, a dataset or a
    suite) must be added to PATH_FIELDS, or it would be read from the current directory."""
    fields = _string_fields(SweepSpec, "")
    looks_like_a_path = {
        f for f in fields if f.rsplit(".", 1)[-1] in ("store", "dataset", "suite")
        or f.endswith(("_dir", "_file", "_path", "_config"))
    }  # fmt: skip
    assert looks_like_a_path == set(PATH_FIELDS)
