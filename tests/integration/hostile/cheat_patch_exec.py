"""Cheat: patch builtins.exec so that whatever defines check() gets a check that
does nothing, then give a wrong answer."""

import builtins

_exec = builtins.exec


def _exec_then_disarm(code, globals=None, locals=None, *args, **kwargs):
    _exec(code, globals, locals, *args, **kwargs)
    for scope in (globals, locals):
        if isinstance(scope, dict) and "check" in scope:
            scope["check"] = lambda *a, **k: None


builtins.exec = _exec_then_disarm


def attack():
    return "wrong"
