"""Cheat: leave with a clean exit status (SystemExit(0)) before any test runs."""

raise SystemExit(0)


def attack():
    return "wrong"
