"""Reading a GGUF file's header: its metadata and its tensors' types and shapes.

Pure Python (the ``gguf`` package is a development dependency only). Only the header
is read, never the tensor data, so a 500 GB file costs a few megabytes of reads.
The format: magic ``GGUF``, version (2 or 3), tensor count and metadata count
(uint64), the metadata (key, type, value), then per tensor its name, dimensions,
ggml type and offset into the data section (aligned to ``general.alignment``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from servesweep.errors import ConfigError

__all__ = ["GGML_TYPES", "GgufFile", "GgufTensor", "ggml_type_name", "read_gguf", "tensor_bytes"]

GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("f32", 1, 4),
    1: ("f16", 1, 2),
    2: ("q4_0", 32, 18),
    3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22),
    7: ("q5_1", 32, 24),
    8: ("q8_0", 32, 34),
    9: ("q8_1", 32, 36),
    10: ("q2_k", 256, 84),
    11: ("q3_k", 256, 110),
    12: ("q4_k", 256, 144),
    13: ("q5_k", 256, 176),
    14: ("q6_k", 256, 210),
    15: ("q8_k", 256, 292),
    16: ("iq2_xxs", 256, 66),
    17: ("iq2_xs", 256, 74),
    18: ("iq3_xxs", 256, 98),
    19: ("iq1_s", 256, 50),
    20: ("iq4_nl", 32, 18),
    21: ("iq3_s", 256, 110),
    22: ("iq2_s", 256, 82),
    23: ("iq4_xs", 256, 136),
    24: ("i8", 1, 1),
    25: ("i16", 1, 2),
    26: ("i32", 1, 4),
    27: ("i64", 1, 8),
    28: ("f64", 1, 8),
    29: ("iq1_m", 256, 56),
    30: ("bf16", 1, 2),
    34: ("tq1_0", 256, 54),
    35: ("tq2_0", 256, 66),
    39: ("mxfp4", 32, 17),
}
"""ggml type id -> (name, elements per block, bytes per block), as in ggml.c."""

_BY_NAME = {name: (block, size) for name, block, size in GGML_TYPES.values()}

_MAGIC = b"GGUF"
_MAX_STRING = 1 << 24
_MAX_COUNT = 1 << 28
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.ggml_type, self.shape)


@dataclass(frozen=True)
class GgufFile:
    path: str
    metadata: dict[str, Any]
    """Scalar values and short arrays; arrays over 64 items keep their length only
    (``[<n items>]`` as an int under the key)."""
    tensors: tuple[GgufTensor, ...]
    alignment: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """``{architecture}.{key}`` (``llama.block_count``)."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def ggml_type_name(type_id: int) -> str:
    return GGML_TYPES[type_id][0] if type_id in GGML_TYPES else f"type{type_id}"


def tensor_bytes(type_id: int | str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of this ggml type (id or name: ``f16``, ``q8_0``) and shape."""
    if isinstance(type_id, str):
        if type_id not in _BY_NAME:
            raise ValueError(f"unknown ggml type {type_id!r}")
        block, size = _BY_NAME[type_id]
    else:
        if type_id not in GGML_TYPES:
            raise ValueError(f"unknown ggml type id {type_id}")
        _, block, size = GGML_TYPES[type_id]
    elements = 1
    for dim in shape:
        elements *= dim
    return elements // block * size


class _Reader:
    def __init__(self, stream: BinaryIO, path: str) -> None:
        self.stream = stream
        self.path = path

    def take(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise ConfigError(f"{self.path}: the GGUF header ends early (a truncated file?)")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > _MAX_STRING:
            raise ConfigError(f"{self.path}: a GGUF string of {n} bytes (not a GGUF file?)")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item = self.scalar("<I")
            n = self.scalar("<Q")
            if n > _MAX_COUNT:
                raise ConfigError(f"{self.path}: a GGUF array of {n} items (not a GGUF file?)")
            if item in _SCALARS and n > 64:
                self.take(n * struct.calcsize(_SCALARS[item]))
                return n
            values = [self.value(item) for _ in range(n)]
            return values if n <= 64 else n
        raise ConfigError(f"{self.path}: unknown GGUF value type {kind}")


def read_gguf(path: str | Path) -> GgufFile:
    """The header of a GGUF file. Raises ConfigError when the file cannot be read or
    is not a GGUF file (of version 2 or 3)."""
    name = str(path)
    try:
        with open(path, "rb") as raw:
            return _parse(_Reader(raw, name))
    except OSError as exc:
        raise ConfigError(f"cannot read {name}: {exc.strerror or exc}") from exc


def _parse(r: _Reader) -> GgufFile:
    if r.take(4) != _MAGIC:
        raise ConfigError(f"{r.path} is not a GGUF file (no GGUF magic)")
    version = r.scalar("<I")
    if version not in (2, 3):
        raise ConfigError(f"{r.path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors = r.scalar("<Q")
    n_kv = r.scalar("<Q")
    if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise ConfigError(f"{r.path}: implausible GGUF counts (a damaged file?)")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.scalar("<I"))
    tensors = []
    for _ in range(n_tensors):
        tname = r.string()
        n_dims = r.scalar("<I")
        if n_dims > 8:
            raise ConfigError(f"{r.path}: tensor {tname} has {n_dims} dimensions")
        shape = tuple(r.scalar("<Q") for _ in range(n_dims))
        kind = r.scalar("<I")
        offset = r.scalar("<Q")
        tensors.append(GgufTensor(tname, shape, kind, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = 32
    return GgufFile(path=r.path, metadata=metadata, tensors=tuple(tensors), alignment=alignment)
