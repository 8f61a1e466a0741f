"""Writing GGUF files (version 3, little-endian), one tensor at a time (the format: ``reader.py``).

The header, metadata and tensor table are written first (every tensor's size follows from its shape and
type), then each tensor's bytes, each starting at a multiple of the alignment (32). Metadata values are
typed by their Python type: ``str`` string, ``bool`` bool, ``int`` uint32 (uint64 above it, int32 if
negative), ``float`` float32, lists of one of those as arrays (int lists as int32, as llama.cpp writes
token types), or a ``(type id, value)`` pair for an explicit GGUF value type.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from dictation.asr.checkpoints.gguf.quantize import TYPE_IDS, kind

ALIGNMENT = 32
GGUF_VERSION = 3
_UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64 = 4, 5, 6, 7, 8, 9, 10
_PACK = {_UINT32: "<I", _INT32: "<i", _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q"}


@dataclass(frozen=True)
class PlannedTensor:
    name: str  # the GGUF name
    shape: tuple[int, ...]  # torch order
    type_name: str  # "F32", "Q8_0", ...
    source: str = ""  # what to read (the caller's key; our parameter name)

    @property
    def n_bytes(self) -> int:
        k = kind(self.type_name)
        n = 1
        for d in self.shape:
            n *= d
        return n // k.block_size * k.type_size


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _typed(value: Any) -> tuple[int, Any]:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], int):
        return value
    if isinstance(value, bool):
        return _BOOL, value
    if isinstance(value, int):
        return (_INT32 if value < 0 else _UINT32 if value < 1 << 32 else _UINT64), value
    if isinstance(value, float):
        return _FLOAT32, value
    if isinstance(value, str):
        return _STRING, value
    if isinstance(value, (list, tuple)):
        items = list(value)
        item_type = (
            _STRING
            if items and isinstance(items[0], str)
            else _FLOAT32
            if items and isinstance(items[0], float)
            else _INT32
        )
        if items and isinstance(items[0], bool):
            item_type = _BOOL
        return _ARRAY, (item_type, items)
    raise TypeError(f"no GGUF type for {type(value).__name__}")


def _value(vtype: int, value: Any) -> bytes:
    if vtype == _STRING:
        return _string(value)
    if vtype == _ARRAY:
        item_type, items = value
        head = struct.pack("<IQ", item_type, len(items))
        if item_type == _STRING:
            return head + b"".join(_string(s) for s in items)
        dtype = {_UINT32: "<u4", _INT32: "<i4", _FLOAT32: "<f4", _BOOL: "<u1", _UINT64: "<u8"}[item_type]
        return head + np.asarray(items, dtype=dtype).tobytes()
    return struct.pack(_PACK[vtype], value)


def header_bytes(metadata: dict[str, Any], tensors: Sequence[PlannedTensor]) -> bytes:
    """Everything before the tensor data, padded to the alignment."""
    parts = [b"GGUF", struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(metadata))]
    for key, value in metadata.items():
        vtype, v = _typed(value)
        parts.append(_string(key) + struct.pack("<I", vtype) + _value(vtype, v))
    offset = 0
    for t in tensors:
        dims = tuple(reversed(t.shape)) or (1,)
        parts.append(_string(t.name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims))
        parts.append(struct.pack("<IQ", TYPE_IDS[t.type_name], offset))
        offset += -(-t.n_bytes // ALIGNMENT) * ALIGNMENT
    raw = b"".join(parts)
    return raw + b"\0" * (-len(raw) % ALIGNMENT)


def write_gguf(
    f: BinaryIO,
    metadata: dict[str, Any],
    tensors: Sequence[PlannedTensor],
    produce: Callable[[PlannedTensor], np.ndarray | Iterable[np.ndarray]],
    on_tensor: Callable[[PlannedTensor], None] | None = None,
) -> None:
    """Write a GGUF file to ``f``; ``produce(t)`` gives each tensor's bytes, in the order given: an array,
    or arrays written one after the other (a large tensor in slices)."""
    f.write(header_bytes(metadata, tensors))
    for t in tensors:
        parts = produce(t)
        written = 0
        for part in [parts] if isinstance(parts, np.ndarray) else parts:
            data = np.ascontiguousarray(part).view(np.uint8).reshape(-1)
            f.write(memoryview(data))
            written += data.size
        if written != t.n_bytes:
            raise ValueError(f"{t.name}: {written} bytes produced, {t.n_bytes} planned")
        f.write(b"\0" * (-written % ALIGNMENT))
        if on_tensor is not None:
            on_tensor(t)
