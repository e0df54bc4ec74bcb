"""Cheat: return an object that says it equals anything."""


class Anything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def attack():
    return Anything()
