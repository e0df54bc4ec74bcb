"""``when`` expressions: safe boolean conditions between server params.

A ``when`` expression keeps a server config only where it is true, e.g.
``speculative_eagle_topk <= speculative_num_draft_tokens``. It is parsed with
:mod:`ast` and evaluated by a small interpreter that knows only:

- names (params; ``-`` and ``.`` in a param name are written ``_``), constants
  (numbers, strings, ``True``/``False``/``None``);
- comparisons ``== != < <= > >=`` (chained too) and ``in`` / ``not in`` with a
  list or tuple literal (``topk in [4, 6]``);
- ``and``, ``or``, ``not``; arithmetic ``+ - * / // %`` on numbers; unary ``-``/``+``.

Anything else (calls, attributes, subscripts, lambdas, comprehensions...) is a
:class:`~servesweep.errors.ConfigError`. Nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servesweep.errors import ConfigError

__all__ = ["WhenExpr", "compile_when", "when_name"]

_MAX_LENGTH = 1000

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: lambda a, b: _same(a, b),
    ast.NotEq: lambda a, b: not _same(a, b),
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_ARITH: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_SYMBOLS: dict[type[ast.AST], str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
}
_NOT_ALLOWED: dict[type[ast.AST], str] = {
    ast.Call: "function calls",
    ast.Attribute: "attribute access",
    ast.Subscript: "subscripts",
    ast.Lambda: "lambdas",
    ast.Pow: "'**'",
    ast.IfExp: "'x if c else y'",
    ast.ListComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.Is: "'is' (use '==')",
    ast.IsNot: "'is not' (use '!=')",
    ast.NamedExpr: "':='",
    ast.Starred: "'*'",
    ast.List: "a list outside 'in [...]'",
    ast.Tuple: "a tuple outside 'in (...)'",
    ast.Dict: "dict literals",
    ast.Set: "set literals",
    ast.JoinedStr: "f-strings",
}


def when_name(param: str) -> str:
    """How a param is named inside a ``when`` expression: ``-`` and ``.`` become ``_``."""
    return param.replace("-", "_").replace(".", "_")


@dataclass(frozen=True)
class WhenExpr:
    """A parsed, checked ``when`` expression."""

    text: str
    names: frozenset[str]
    """The param names it uses, as written (underscore form)."""
    tree: ast.Expression

    def evaluate(self, params: Mapping[str, Any], *, label: str = "") -> bool:
        """True when the config with these params satisfies the expression.

        Raises ConfigError when the config lacks a param the expression names, or
        when the expression cannot be computed for it (``'a' < 3``, division by zero).
        """
        return bool(self.value(params, label=label))

    def value(self, params: Mapping[str, Any], *, label: str = "") -> Any:
        """The expression's value for a config (a number for arithmetic); errors as
        :meth:`evaluate`."""
        scope = {when_name(k): v for k, v in params.items()}
        where = label or _params_label(params)
        missing = sorted(self.names - scope.keys())
        if missing:
            raise ConfigError(
                f"when {self.text!r} names {', '.join(map(repr, missing))}, "
                f"which the config {where} does not set"
            )
        try:
            return _eval(self.tree.body, scope)
        except (TypeError, ArithmeticError, _NotNumeric) as exc:
            raise ConfigError(
                f"when {self.text!r} cannot be computed for the config {where}: {exc}"
            ) from None


class _NotNumeric(Exception):
    pass


def _params_label(params: Mapping[str, Any]) -> str:
    if not params:
        return "(defaults)"
    return "{" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + "}"


def compile_when(text: str, params: frozenset[str] | None = None) -> WhenExpr:
    """Parse and check one ``when`` expression.

    ``params`` are the param names of the sweep (as written); a name the expression
    uses that is not among them is a ConfigError with a did-you-mean suggestion.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("empty when expression")
    if len(text) > _MAX_LENGTH:
        raise ConfigError(f"when expression longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        detail = exc.msg or "invalid syntax"
        raise ConfigError(f"invalid when expression {text!r}: {detail}") from None
    names: set[str] = set()
    _check(tree.body, text, names)
    if params is not None:
        known = {when_name(p): p for p in params}
        unknown = sorted(names - known.keys())
        if unknown:
            import difflib

            name = unknown[0]
            hint = difflib.get_close_matches(name, list(known), n=1)
            listed = ", ".join(sorted(known)) or "none"
            more = f" (did you mean {hint[0]!r}?)" if hint else f" (params: {listed})"
            raise ConfigError(f"when {text!r} names unknown param {name!r}{more}")
    return WhenExpr(text=text, names=frozenset(names), tree=tree)


def _check(node: ast.AST, text: str, names: set[str]) -> None:
    def refuse(what: str) -> ConfigError:
        return ConfigError(f"when {text!r}: {what} not allowed")

    if isinstance(node, ast.Name):
        names.add(node.id)
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bool, type(None))):
            raise refuse(f"constant {node.value!r}")
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, text, names)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            raise refuse("'~'")
        _check(node.operand, text, names)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _ARITH:
            raise refuse(_NOT_ALLOWED.get(type(node.op), f"operator {type(node.op).__name__}"))
        _check(node.left, text, names)
        _check(node.right, text, names)
    elif isinstance(node, ast.Compare):
        _check(node.left, text, names)
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, (ast.In, ast.NotIn)):
                if not isinstance(right, (ast.List, ast.Tuple)):
                    raise refuse(f"'{_SYMBOLS[type(op)]}' with anything but a [list] literal")
                for element in right.elts:
                    _check(element, text, names)
            elif type(op) in _COMPARE:
                _check(right, text, names)
            else:
                raise refuse(_NOT_ALLOWED.get(type(op), f"comparison {type(op).__name__}"))
    else:
        what = _NOT_ALLOWED.get(type(node), type(node).__name__)
        raise refuse(what)


def _eval(node: ast.AST, scope: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return scope[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, scope) for v in node.values)
        return any(_eval(v, scope) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, scope)
        if isinstance(node.op, ast.Not):
            return not operand
        _numeric(operand, "-" if isinstance(node.op, ast.USub) else "+")
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, scope), _eval(node.right, scope)
        symbol = _SYMBOLS[type(node.op)]
        _numeric(left, symbol)
        _numeric(right, symbol)
        return _ARITH[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, scope)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, (ast.In, ast.NotIn)):
                assert isinstance(right_node, (ast.List, ast.Tuple))
                options = [_eval(e, scope) for e in right_node.elts]
                found = any(_same(left, option) for option in options)
                ok = found if isinstance(op, ast.In) else not found
                value: Any = options
            else:
                value = _eval(right_node, scope)
                ok = bool(_COMPARE[type(op)](left, value))
            if not ok:
                return False
            left = value
        return True
    raise TypeError(f"unsupported expression {type(node).__name__}")  # pragma: no cover


def _numeric(value: Any, symbol: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _NotNumeric(f"'{symbol}' needs numbers, got {value!r}")


def _same(a: Any, b: Any) -> bool:
    """Equality that does not confuse ``True`` with ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(a == b)
