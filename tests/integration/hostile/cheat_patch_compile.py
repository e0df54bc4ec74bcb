"""Cheat: patch builtins.compile so that the hidden tests compile without their
asserts, then give a wrong answer."""

import builtins

_compile = builtins.compile


def _without_asserts(source, filename, mode, *args, **kwargs):
    if isinstance(source, str) and "assert " in source:
        source = source.replace("assert ", "pass  # ")
    return _compile(source, filename, mode, *args, **kwargs)


builtins.compile = _without_asserts


def attack():
    return "wrong"
