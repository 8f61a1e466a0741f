"""The GGUF file format: header, metadata and tensor table, read without gguf-py (see ``__init__``)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictation.asr.errors import WeightsError

GGUF_MAGIC = b"GGUF"
SINGLE_ARCH = "qwen3asr"
TEXT_ARCHS = ("qwen3vl", "qwen3")
MMPROJ_ARCH = "clip"
MMPROJ_PROJECTOR = "qwen3a"


# --- tensor types -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorType:
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block


SUPPORTED_TYPES: dict[int, TensorType] = {
    0: TensorType("F32", 1, 4),
    1: TensorType("F16", 1, 2),
    30: TensorType("BF16", 1, 2),
    8: TensorType("Q8_0", 32, 34),
    2: TensorType("Q4_0", 32, 18),
    3: TensorType("Q4_1", 32, 20),
    6: TensorType("Q5_0", 32, 22),
    7: TensorType("Q5_1", 32, 24),
    11: TensorType("Q3_K", 256, 110),
    12: TensorType("Q4_K", 256, 144),
    13: TensorType("Q5_K", 256, 176),
    14: TensorType("Q6_K", 256, 210),
}
# ggml type ids we cannot read: names for messages, (values, bytes) per block to find truncated files
_OTHER_TYPES = {
    9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1),
    25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}  # fmt: skip
_FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def type_name(ggml_type: int) -> str:
    known = SUPPORTED_TYPES.get(ggml_type)
    if known:
        return known.name
    return _OTHER_TYPES[ggml_type][0] if ggml_type in _OTHER_TYPES else f"ggml type {ggml_type}"


def _n_bytes(ggml_type: int, n_values: int) -> int | None:
    """Bytes of ``n_values`` values of a ggml type; None for a type id we do not know."""
    known = SUPPORTED_TYPES.get(ggml_type)
    block, size = (known.block_size, known.type_size) if known else _OTHER_TYPES.get(ggml_type, (None, 0, 0))[1:]
    return None if block is None else -(-n_values // block) * size


# --- file parsing -------------------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY, _FLOAT32 = 8, 9, 6
MAX_ARRAY_DEPTH = 16  # arrays of arrays: real files nest one level at most
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GgufTensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # torch order (GGUF's dims reversed)
    offset: int  # absolute byte offset in the file

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def n_values(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GgufFile:
    """One parsed GGUF file: metadata, tensor table, and its memory-mapped bytes."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GgufTensor]
    data: np.ndarray = field(repr=False)  # uint8 memmap (copy-on-write) of the whole file

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def raw(self, tensor: GgufTensor, kind: TensorType) -> np.ndarray:
        """The tensor's bytes (a view of the mapping); WeightsError if the file is too short."""
        n_blocks, rest = divmod(tensor.n_values, kind.block_size)
        if rest or (tensor.shape and tensor.shape[-1] % kind.block_size):
            raise WeightsError(
                f"{self.path}: tensor {tensor.name} has shape {tensor.shape}, not a whole number of "
                f"{kind.name} blocks of {kind.block_size}"
            )
        end = tensor.offset + n_blocks * kind.type_size
        if end > self.data.shape[0]:
            raise WeightsError(
                f"{self.path}: truncated (tensor {tensor.name} ends at byte {end}, the file has "
                f"{self.data.shape[0]}; an interrupted download?)"
            )
        return self.data[tensor.offset : end]


MAX_TENSOR_BYTES = 1 << 40
"""A tensor (or a tensor's offset) beyond 1 TiB is impossible in a model file: the largest of
Qwen3-ASR-1.7B, the 151,936 x 2,048 embeddings, is 622 MB in bf16. A header that says so is corrupt."""


class _CutShort(ValueError):
    """A field of the header runs past the end of the file; the message names the field."""


class _Cursor:
    """Reads the header field by field; ``what`` names the field being read, for messages."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path
        self.what = "the header"

    def need(self, n: int, what: str | None = None) -> None:
        """_CutShort unless ``n`` more bytes are left."""
        if n > len(self.buf) - self.pos:
            raise _CutShort(
                f"{what or self.what} runs past the end of the file ({n:,} bytes from byte {self.pos:,}, "
                f"the file has {len(self.buf):,})"
            )

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.need(n, f"{self.what} (a string of {n:,} bytes)")
        text = str(self.buf[self.pos : self.pos + n], "utf-8")
        self.pos += n
        return text

    def strings(self, count: int) -> list[str]:
        """``count`` strings (a tight loop: a Qwen vocabulary + merges are 300k strings)."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if end - pos < 8:
                self.pos = pos
                self.need(8, f"{self.what} (the length of string {i + 1:,} of {count:,})")
            (n,) = unpack(buf, pos)
            pos += 8
            if n > end - pos:
                self.pos = pos
                self.need(n, f"{self.what} (string {i + 1:,} of {count:,}, {n:,} bytes)")
            append(str(buf[pos : pos + n], "utf-8"))
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item == _STRING:
                return self.strings(count)
            if item == _ARRAY:
                if depth >= MAX_ARRAY_DEPTH:
                    raise ValueError(f"arrays nested more than {MAX_ARRAY_DEPTH} deep at offset {self.pos}")
                return [self.value(_ARRAY, depth + 1) for _ in range(count)]
            if item not in _NUMPY:
                raise ValueError(f"unknown array item type {item}")
            self.need(count * np.dtype(_NUMPY[item]).itemsize, f"{self.what} (an array of {count:,} numbers)")
            arr = np.frombuffer(self.buf, dtype=_NUMPY[item], count=count, offset=self.pos)
            self.pos += arr.nbytes
            values = arr.tolist()
            return [bool(v) for v in values] if item == 7 else values
        if vtype not in _SCALARS:
            raise ValueError(f"unknown value type {vtype}")
        value = self.scalar(_SCALARS[vtype])
        return _shortest_f32(value) if vtype == _FLOAT32 else value


def _shortest_f32(x: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(x)))


def read_gguf_file(path: str | Path, *, architecture_only: bool = False) -> GgufFile:
    """Parse a GGUF file's header, metadata and tensor table; no tensor data is read.

    With ``architecture_only`` parsing stops once ``general.architecture`` is known (cheap).
    Raises WeightsError naming the file if it is not a readable GGUF file.
    """
    path = Path(path)
    try:
        if path.exists() and not path.is_file() and not path.is_dir():
            raise WeightsError(f"{path}: not a regular file (a FIFO, socket or device), so not a GGUF file")
        size = path.stat().st_size
        if size < 24:
            raise WeightsError(f"{path}: not a GGUF file ({size} bytes)")
        data = np.memmap(path, dtype=np.uint8, mode="c")
    except OSError as exc:
        raise WeightsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    cur = _Cursor(memoryview(data), path)
    if bytes(cur.buf[:4]) != GGUF_MAGIC:
        raise WeightsError(f"{path}: not a GGUF file (no GGUF magic bytes)")
    cur.pos = 4
    try:
        version = cur.scalar("<I")
        if version not in (2, 3):
            what = "a big-endian GGUF file" if version > 0xFFFF else f"GGUF version {version}"
            raise WeightsError(f"{path}: {what} is not supported (little-endian GGUF v2/v3 only)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        if n_tensors > size or n_kv > size:
            raise ValueError(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            cur.what = f"the name of metadata key {i + 1} of {n_kv}"
            key = cur.string()
            cur.what = f"metadata key {_short(key)}"
            metadata[key] = cur.value(cur.scalar("<I"))
            if architecture_only and key == "general.architecture":
                return GgufFile(path, version, metadata, {}, data)
        if architecture_only:
            return GgufFile(path, version, metadata, {}, data)
        infos = []
        for i in range(n_tensors):
            cur.what = f"the name of tensor {i + 1} of {n_tensors} in the tensor table"
            name = cur.string()
            cur.what = f"the entry of tensor {_short(name)} in the tensor table"
            n_dims = cur.scalar("<I")
            if n_dims > 8:
                raise ValueError(f"tensor {name} has {n_dims} dimensions")
            cur.need(8 * n_dims)
            dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
            cur.pos += 8 * n_dims
            ggml_type, offset = cur.scalar("<I"), cur.scalar("<Q")
            infos.append((name, ggml_type, tuple(reversed(dims)), offset))
    except _CutShort as exc:
        raise WeightsError(f"{path}: cut short or corrupt: {exc}; an interrupted download?") from None
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise WeightsError(f"{path}: not a readable GGUF file ({exc})") from None
    alignment = metadata.get("general.alignment", 32)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise WeightsError(f"{path}: not a readable GGUF file (general.alignment {alignment!r} is not a power of two)")
    start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GgufTensor] = {}
    for name, ggml_type, shape, offset in infos:
        if name in tensors:
            raise WeightsError(f"{path}: tensor {name} appears twice")
        tensor = tensors[name] = GgufTensor(name, ggml_type, shape, start + offset)
        n_bytes = _n_bytes(ggml_type, tensor.n_values)
        if offset > MAX_TENSOR_BYTES or (n_bytes or 0) > MAX_TENSOR_BYTES:
            what = "data offset" if offset > MAX_TENSOR_BYTES else f"size (its {len(shape)}-D shape)"
            raise WeightsError(
                f"{path}: corrupt header: tensor {_short(name)} has an impossible {what}, beyond 1 TiB "
                f"(the file has {size:,} bytes)"
            )
        if n_bytes is not None and tensor.offset + n_bytes > size:
            raise WeightsError(
                f"{path}: truncated (tensor {name} ends at byte {tensor.offset + n_bytes}, the file has {size}; "
                "an interrupted download?)"
            )
    return GgufFile(path, version, metadata, tensors, data)


def _short(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut to ``limit`` characters (names from a damaged file can be huge)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def is_gguf(path: str | Path) -> bool:
    """True for a GGUF file, or a folder holding at least one ``.gguf`` GGUF file."""
    path = Path(path)
    if path.is_dir():
        return any(_has_magic(p) for p in sorted(path.glob("*.gguf")))
    return _has_magic(path)


def _has_magic(path: Path) -> bool:
    if not path.is_file():  # a FIFO or a device would block the read, and is no model
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
