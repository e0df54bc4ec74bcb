"""What the docs state about the code, checked against the code: the CLI's exit codes,
the systemd drop-in of ``envfile`` mode, which low-layer modules do I/O."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from servesweep.cli import main as cli_main
from servesweep.servers.launchers.systemd_unit import args_dropin_text, dropin_text
from servesweep.spec.schema import SystemdSpec

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "servesweep"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def test_architecture_lists_every_exit_code_of_the_cli() -> None:
    codes = {
        value
        for name, value in vars(cli_main).items()
        if name.startswith("EXIT_") and isinstance(value, int)
    }
    table = _section((ROOT / "docs" / "architecture.md").read_text(), "## Exit codes")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == codes


def _directives(dropin: str) -> set[str]:
    return set(re.findall(r"^([A-Za-z]+)=", dropin, re.MULTILINE))


def test_the_envfile_mode_is_described_as_the_drop_in_it_writes() -> None:
    argv, env = ["/opt/vllm/bin/vllm", "serve", "--port", "8000"], {"CUDA_VISIBLE_DEVICES": "0"}
    envfile = _directives(args_dropin_text(argv, env, "7"))
    execstart = _directives(dropin_text(argv, env, "7"))
    assert envfile == {"Environment"} and execstart == {"ExecStart", "Environment"}
    row = next(
        line
        for line in (ROOT / "docs" / "sweep-file.md").read_text().splitlines()
        if line.startswith("| `mode` | `execstart`, `envfile`")
    )
    docstring = inspect.getsource(SystemdSpec)
    for text in (row, docstring, (ROOT / "docs" / "launchers.md").read_text()):
        # every directive the code writes is named, none that it does not write
        assert "Environment=" in text
        for directive in ("EnvironmentFile", "PassEnvironment", "UnsetEnvironment"):
            assert directive not in text


_IO_CALLS = {
    "open", "read_text", "read_bytes", "write_text", "write_bytes", "stat", "is_dir",
    "is_file", "exists", "mkdir", "unlink", "cwd", "getcwd", "getenv", "listdir",
    "scandir", "run", "Popen", "socket", "connect",
}  # fmt: skip


def _io_modules(paths: list[Path]) -> set[str]:
    """Modules that call file, process, network or environment functions."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            elif isinstance(node, ast.Attribute) and node.attr == "environ":
                name = "open"
            if name in _IO_CALLS:
                found.add(str(path.relative_to(SRC)))
    return found


def test_only_spec_load_does_io_in_the_lowest_layer() -> None:
    low = [SRC / "models.py", SRC / "errors.py", SRC / "metrics_catalog.py"]
    low += sorted((SRC / "spec").glob("*.py"))
    assert _io_modules(low) == {"spec/load.py"}
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "no I/O" not in text.split("| package |")[0].split("```")[1]  # not in the diagram
    assert "except `spec.load`, which reads the sweep file" in text
