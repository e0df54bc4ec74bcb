"""Plain data between the judge and the candidate: values keep their exact builtin
types, nothing else crosses, and hostile encodings are refused."""

from __future__ import annotations

import io
import json
from collections import Counter, OrderedDict, namedtuple
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from servesweep.bench.evals import wire

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**53,
    -(2**200) + 1,
    10**5000,
    1.5,
    -0.0,
    float("inf"),
    float("-inf"),
    2.0,
    1e-300,
    3 + 4j,
    complex(float("inf"), -1.0),
    "",
    'héllo\n"quoted"\x00',
    b"\x00\xffbytes",
    bytearray(b"mutable"),
    [],
    [1, [2, [3, "x"]]],
    (),
    (1, (2.0, "t")),
    {},
    {"a": 1, 2: "b", (1, 2): [3], None: False, 1.5: frozenset({1})},
    {1, 2, 3},
    frozenset({"a", (1, 2)}),
    Fraction(1, 3),
    Decimal("1.10"),
]


def _roundtrip(value: Any) -> Any:
    return wire.decode(json.loads(json.dumps(wire.encode(value))))


def _types(value: Any) -> Any:
    """The value's shape with every type spelled out (``1 == True`` hides bool)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return (type(value), sorted(map(repr, map(_types, value))))
    if isinstance(value, dict):
        return (dict, sorted(repr((_types(k), _types(v))) for k, v in value.items()))
    if type(value) is int:
        return (int, format(value, "x"))  # repr() refuses ints of over 4300 digits
    return (type(value), repr(value))


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_plain_values_cross_with_their_exact_types(value: Any) -> None:
    back = _roundtrip(value)
    assert _types(back) == _types(value)


def test_nan_crosses() -> None:
    back = _roundtrip(float("nan"))
    assert type(back) is float and back != back


def test_subclasses_of_builtins_cross_as_the_builtin() -> None:
    """A str or int subclass (or namedtuple, Counter...) arrives as the plain value:
    whatever its class said about equality stays behind."""

    class Chameleon(str):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    point = namedtuple("point", "x y")
    for value, plain in [
        (Chameleon("wrong"), "wrong"),
        (point(1, 2), (1, 2)),
        (Counter("aab"), {"a": 2, "b": 1}),
        (OrderedDict(b=1), {"b": 1}),
    ]:
        back = _roundtrip(value)
        assert type(back) is type(plain) and back == plain
    assert _roundtrip(Chameleon("wrong")) != "right"


class Anything:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


@pytest.mark.parametrize(
    "value",
    [Anything(), [1, Anything()], {"k": Anything()}, len, print, iter([1]), range(3), object()],
    ids=lambda v: type(v).__name__,
)
def test_anything_else_does_not_cross(value: Any) -> None:
    with pytest.raises(wire.NotData, match="value of type"):
        wire.encode(value)


def test_too_deep_or_too_big_does_not_cross() -> None:
    deep: list[Any] = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.NotData, match="nested"):
        wire.encode(deep)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(wire.NotData):
        wire.encode(loop)
    with pytest.raises(wire.NotData, match="items"):
        wire.encode([0] * (wire.MAX_ITEMS + 1))


@pytest.mark.parametrize(
    "data",
    [
        {"a": 1},  # a plain JSON object is not an encoding
        {"T": "object", "v": []},
        {"T": "tuple", "v": [], "extra": 1},
        {"T": "set", "v": [[1, 2]]},  # unhashable item
        {"T": "dict", "v": [[[1], 2]]},  # unhashable key
        {"T": "dict", "v": [[1, 2, 3]]},
        {"T": "int", "v": "zz"},
        {"T": "float", "v": "1e999"},
        {"T": "bytes", "v": 5},
        {"T": "fraction", "v": [1, 0]},
        {"T": "fraction", "v": [1.5, 2]},
        {"T": "decimal", "v": "not a number"},
        {"T": "complex", "v": [1]},
        {"T": 3, "v": []},
    ],
    ids=str,
)
def test_hostile_encodings_are_refused(data: Any) -> None:
    with pytest.raises(wire.NotData):
        wire.decode(data)


def test_deeply_nested_json_is_refused() -> None:
    with pytest.raises(wire.NotData):
        wire.decode(json.loads("[" * 500 + "]" * 500))


def test_messages_are_lines_of_json_objects() -> None:
    stream = io.BytesIO()
    wire.send(stream, {"call": "f", "args": [wire.encode("a\nb")]})
    assert stream.getvalue().count(b"\n") == 1
    stream.seek(0)
    assert wire.receive(stream) == {"call": "f", "args": ["a\nb"]}
    assert wire.receive(stream) is None  # end of the stream


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"ok": 1}', "cut off"),
        (b"[1, 2]\n", "not a JSON object"),
        (b"nonsense\n", "not JSON"),
        (b"[" * 100000 + b"\n", "not JSON"),
    ],
)
def test_broken_messages_are_protocol_errors(raw: bytes, words: str) -> None:
    with pytest.raises(wire.ProtocolError, match=words):
        wire.receive(io.BytesIO(raw))


def test_a_message_over_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_MESSAGE", 10)
    with pytest.raises(wire.ProtocolError, match="over 10 bytes"):
        wire.receive(io.BytesIO(b'{"x": "0123456789"}\n'))
