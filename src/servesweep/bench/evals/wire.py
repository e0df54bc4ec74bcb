"""Plain data between the judge and the candidate's process: the only thing that
crosses between them.

Standard library only: this file is copied next to the two programs that run in
the sandbox (``sandboxed_candidate.py``, ``sandboxed_judge.py``) and imported there.
Both ends use it, but only the judge's :func:`decode` matters for a verdict: it
builds values of exact builtin types (or ``Fraction``/``Decimal``) from JSON, so
whatever the candidate's process sends, what the tests compare is plain data whose
``__eq__`` is Python's own. An object with a custom ``__eq__`` cannot cross; a
``str`` or ``int`` subclass crosses as a plain ``str`` or ``int``.

Encoding: JSON ``null``, ``true``, ``false``, strings, numbers (ints below 2**53,
finite floats) and arrays (lists) stand for themselves; every other value is an
object ``{"T": tag, "v": payload}``:

======== ===================================
tag      payload
======== ===================================
type     the name of one of these builtin types (``int``, ``list``...)
ref      a number: an object of the answer's own (see below)
int      hexadecimal digits (ints from 2**53)
float    ``"nan"``, ``"inf"`` or ``"-inf"``
complex  ``[real, imag]`` (two encoded floats)
bytes    base64; ``bytearray`` the same
tuple    array of encoded items
dict     array of ``[key, value]`` pairs
set      array of items; ``frozenset`` the same
fraction ``[numerator, denominator]``
decimal  the decimal's string
======== ===================================

A reference stands for an object of the answer's own that stays in the
candidate's process: an instance the tests made by calling one of its classes
(MBPP's ``Node(1)``), or an attribute of such an object. The judge holds it as an
opaque stand-in that compares equal only to itself, so it can be passed back to
the answer, never taken for a value.

Messages are one JSON object per line (``ensure_ascii``: no raw newline inside),
at most :data:`MAX_MESSAGE` bytes.

Imports are kept to what an interpreter loads anyway or cheaply (``fractions``
and ``decimal`` only when a value needs them): both ends start per run.
"""

from __future__ import annotations

import binascii
import json
import math
import sys
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_MESSAGE",
    "NotData",
    "ProtocolError",
    "decode",
    "encode",
    "receive",
    "send",
]

MAX_MESSAGE = 16 << 20
MAX_DEPTH = 100
MAX_ITEMS = 1_000_000
_EXACT_INT = 1 << 53
PLAIN_TYPES = (
    "None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, "
    "frozenset, Fraction, Decimal, or one of these types itself"
)
_TYPES = {
    t.__name__: t
    for t in (bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset)
}


class NotData(TypeError):
    """A value that is not plain data (or too big or too deep to send)."""


class ProtocolError(ValueError):
    """A message that is not one line of JSON object within the size limit."""


def encode(value: Any, other: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as JSON-ready data; anything else goes to ``other`` (which returns
    an encoding, e.g. a reference) or raises :class:`NotData`."""
    return _Encoder(other).encode(value, 0)


class _Encoder:
    def __init__(self, other: Callable[[Any], Any] | None) -> None:
        self.other = other
        self.budget = MAX_ITEMS

    def encode(self, value: Any, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise NotData(f"a value of more than {MAX_ITEMS} items")
        if depth > MAX_DEPTH:
            raise NotData(f"a value nested more than {MAX_DEPTH} levels deep")
        if value is None or value is True or value is False:
            return value
        inner = depth + 1
        if isinstance(value, int):
            number = int(value)
            if -_EXACT_INT < number < _EXACT_INT:
                return number
            return {"T": "int", "v": format(number, "x")}
        if isinstance(value, float):
            return _float(float(value))
        if isinstance(value, complex):
            return {"T": "complex", "v": [_float(value.real), _float(value.imag)]}
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, bytearray):
            return {"T": "bytearray", "v": _b64(bytes(value))}
        if isinstance(value, bytes):
            return {"T": "bytes", "v": _b64(bytes(value))}
        if isinstance(value, list):
            return [self.encode(item, inner) for item in list(value)]
        if isinstance(value, tuple):
            return {"T": "tuple", "v": [self.encode(item, inner) for item in tuple(value)]}
        if isinstance(value, dict):
            pairs = [[self.encode(k, inner), self.encode(v, inner)] for k, v in dict(value).items()]
            return {"T": "dict", "v": pairs}
        if isinstance(value, frozenset):
            return {"T": "frozenset", "v": [self.encode(item, inner) for item in value]}
        if isinstance(value, set):
            return {"T": "set", "v": [self.encode(item, inner) for item in set(value)]}
        fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
        if fractions is not None and isinstance(value, fractions.Fraction):
            parts = (value.numerator, value.denominator)
            return {"T": "fraction", "v": [self.encode(p, inner) for p in parts]}
        if decimal is not None and isinstance(value, decimal.Decimal):
            return {"T": "decimal", "v": str(value)}
        name = getattr(value, "__name__", None) if isinstance(value, type) else None
        if name is not None and _TYPES.get(name) is value:
            return {"T": "type", "v": name}
        if self.other is not None:
            return self.other(value)
        raise NotData(f"a value of type {type(value).__name__}")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _float(number: float) -> Any:
    if math.isfinite(number):
        return number
    return {"T": "float", "v": repr(number)}


def decode(data: Any, ref: Callable[[int], Any] | None = None) -> Any:
    """The plain value ``data`` stands for; raises :class:`NotData` for anything
    that is not an encoding made by :func:`encode` (never calls foreign code).
    A reference ``{"T": "ref", "v": n}`` becomes ``ref(n)``, where allowed."""
    try:
        return _Decoder(ref).decode(data, 0)
    except RecursionError as exc:
        raise NotData("a value nested too deeply") from exc


class _Decoder:
    def __init__(self, ref: Callable[[int], Any] | None) -> None:
        self.ref = ref
        self.budget = MAX_ITEMS

    def decode(self, data: Any, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise NotData(f"a value of more than {MAX_ITEMS} items")
        if depth > MAX_DEPTH:
            raise NotData(f"a value nested more than {MAX_DEPTH} levels deep")
        kind = type(data)
        if data is None or kind in (bool, int, float, str):
            return data
        if kind is list:
            return [self.decode(item, depth + 1) for item in data]
        if kind is not dict or set(data) != {"T", "v"} or type(data["T"]) is not str:
            raise NotData(f"not an encoded value: {type(data).__name__}")
        tag, payload = data["T"], data["v"]
        try:
            return self.tagged(tag, payload, depth + 1)
        except NotData:
            raise
        except (ArithmeticError, TypeError, ValueError) as exc:  # decimal's, binascii.Error
            raise NotData(f"a bad {tag!r} value: {type(exc).__name__}") from exc

    def tagged(self, tag: str, payload: Any, depth: int) -> Any:
        if tag == "int" and type(payload) is str and payload.lstrip("-").isalnum():
            return int(payload, 16)
        if tag == "float" and payload in ("nan", "inf", "-inf"):
            return float(payload)
        if tag in ("bytes", "bytearray") and type(payload) is str:
            raw = binascii.a2b_base64(payload.encode("ascii"))
            return raw if tag == "bytes" else bytearray(raw)
        if tag == "decimal" and type(payload) is str:
            from decimal import Decimal

            return Decimal(payload)
        if tag == "type" and type(payload) is str and payload in _TYPES:
            return _TYPES[payload]
        if tag == "ref" and type(payload) is int and self.ref is not None:
            return self.ref(payload)
        if type(payload) is not list:
            raise NotData(f"a bad {tag!r} value")
        items = [self.decode(item, depth) for item in payload]
        if tag == "tuple":
            return tuple(items)
        if tag == "set":
            return set(items)
        if tag == "frozenset":
            return frozenset(items)
        if tag == "dict" and all(type(p) is list and len(p) == 2 for p in items):
            return {key: value for key, value in items}
        numbers = all(type(x) in (int, float) for x in items)
        if tag == "complex" and len(items) == 2 and numbers:
            return complex(items[0], items[1])
        if tag == "fraction" and len(items) == 2 and all(type(x) is int for x in items):
            from fractions import Fraction

            return Fraction(items[0], items[1])
        raise NotData(f"a bad {tag!r} value")


def send(stream: IO[bytes], message: dict[str, Any]) -> None:
    """Write ``message`` as one line and flush it."""
    stream.write(json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n")
    stream.flush()


def receive(stream: IO[bytes]) -> dict[str, Any] | None:
    """The next message, ``None`` at the end of the stream; raises
    :class:`ProtocolError` for anything that is not a message."""
    line = stream.readline(MAX_MESSAGE + 1)
    if not line:
        return None
    if len(line) > MAX_MESSAGE:
        raise ProtocolError(f"a message over {MAX_MESSAGE} bytes")
    if not line.endswith(b"\n"):
        raise ProtocolError("a message cut off by the end of the stream")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {type(exc).__name__}") from exc
    if type(message) is not dict:
        raise ProtocolError(f"a {type(message).__name__}, not a JSON object")
    return message
