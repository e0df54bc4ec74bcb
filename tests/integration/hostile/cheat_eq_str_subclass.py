"""Cheat: return a str whose __eq__ says True to everything (it passes isinstance
checks for str)."""


class Chameleon(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


def attack():
    return Chameleon("wrong")
