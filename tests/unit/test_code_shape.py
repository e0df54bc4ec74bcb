"""Shape rules for servesweep's own code, checked on its source: no function outside
the click commands takes more than :data:`MAX_PARAMS` parameters (a longer list is a
spec spelled out field by field: pass the spec and one options object instead), and no
module of ``servesweep.sweep`` is longer than :data:`MAX_SWEEP_LINES` lines (a longer
one holds more than one idea: split it by them)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "servesweep"
MAX_PARAMS = 10
"""Parameters a function may take (``self``/``cls`` not counted; ``*args`` and
``**kwargs`` count one each)."""

MAX_SWEEP_LINES = 500
"""Lines a module under ``src/servesweep/sweep`` may have (``wc -l``)."""

_CLICK_DECORATORS = {"command", "group", "option", "argument"}


def _is_click_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with click's command, group, option or argument decorators
    (``@click.option(...)``, ``@cli.command(...)``): its parameters are its flags."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr in _CLICK_DECORATORS:
            return True
    return False


def _param_count(args: ast.arguments) -> int:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (args.vararg is not None) + (args.kwarg is not None)


def long_signatures(source: str, where: str) -> Iterator[str]:
    """``where:line name (N parameters)`` for each function of ``source`` over the limit."""
    functions = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for node in sorted(functions, key=lambda n: n.lineno):
        count = _param_count(node.args)
        if count > MAX_PARAMS and not _is_click_command(node):
            yield f"{where}:{node.lineno} {node.name} ({count} parameters)"


def test_no_function_outside_click_commands_takes_more_than_ten_parameters() -> None:
    found = [
        line
        for path in sorted(SRC.rglob("*.py"))
        for line in long_signatures(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "pass a spec or an options object instead:\n" + "\n".join(found)


def test_the_parameter_rule_sees_long_signatures_and_spares_click_commands() -> None:
    params = ", ".join(f"p{i}" for i in range(MAX_PARAMS))
    source = f"""
class C:
    def ok(self, {params}): ...
    async def too_many(self, {params}, *rest): ...

def also_too_many({params}, **kw): ...

@cli.command()
@click.option("--x")
def command({params}, x): ...
"""
    assert [line.split(" ")[1] for line in long_signatures(source, "m.py")] == [
        "too_many",
        "also_too_many",
    ]


def long_modules(root: Path, limit: int) -> list[str]:
    """``path (N lines)`` for each module under ``root`` longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().count("\n")
        if lines > limit:
            found.append(f"{path.relative_to(root)} ({lines} lines)")
    return found


def test_no_module_of_the_sweep_package_is_over_500_lines() -> None:
    root = SRC / "sweep"
    assert len(list(root.rglob("*.py"))) > 30, "the sweep package is where it was"
    found = long_modules(root, MAX_SWEEP_LINES)
    assert not found, "split these by their ideas:\n" + "\n".join(found)


def test_the_length_rule_counts_lines_as_wc_does(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.py").write_text("x = 1\n" * 6)
    (tmp_path / "short.py").write_text("x = 1\n" * 5)
    assert long_modules(tmp_path, 5) == ["sub/long.py (6 lines)"]
