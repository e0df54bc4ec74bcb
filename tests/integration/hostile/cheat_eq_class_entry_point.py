"""Cheat: make the entry point a class whose instances equal anything, so that
calling it answers with such an instance."""


class attack:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__
