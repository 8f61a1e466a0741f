"""Reading one safetensors file's tensors: mapped where the model holds them as stored, read otherwise.

The file's header was checked by ``locate.read_header`` (sizes, offsets, no overlap) before a reader
opens it; ``safetensors.load_model`` decides, tensor by tensor, which way each is filled
(docs/engine.md, "CPU memory").
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

from dictation.asr.errors import WeightsError

_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}


class TensorReader:
    """Reads a safetensors file's tensors one at a time (its header was checked by
    ``locate.read_header``): a tensor the model holds exactly as stored is mapped (:meth:`map`), every
    other one is read with plain reads. The file is never mapped whole: the pages of a mapping that
    were read count towards the process's resident memory until it is unmapped, which put the whole
    file on top of the model at the peak of a load (docs/engine.md, "CPU memory")."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "rb")  # noqa: SIM115 - closed by __exit__
        (n,) = struct.unpack("<Q", self._file.read(8))
        header = json.loads(self._file.read(n))
        header.pop("__metadata__", None)
        self._base = 8 + n
        self._entries = header

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def has(self, name: str) -> bool:
        return name in self._entries

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def dtype(self, name: str) -> torch.dtype:
        stored = self._entries[name]["dtype"]
        if stored not in _DTYPES:
            raise WeightsError(f"{self.path}: tensor {name} has an unsupported dtype {stored}")
        return _DTYPES[stored]

    def _read(self, name: str, out: torch.Tensor) -> None:
        begin, end = self._entries[name]["data_offsets"]
        buffer = out.view(-1).view(torch.uint8).numpy()
        self._file.seek(self._base + begin)
        if end - begin != buffer.nbytes or self._file.readinto(buffer) != buffer.nbytes:
            raise WeightsError(f"{self.path}: tensor {name} is truncated (an interrupted download?)")

    def map_run(self, names: list[str]) -> torch.Tensor | None:
        """The tensors ``names`` (one, or several of one dtype stored one after the other in this order)
        as one flat CPU tensor whose memory is the file's own pages: a private copy-on-write mapping of
        just their bytes, so nothing is copied or zeroed, the pages are the page cache's (read from disk
        only where not cached), and it is unmapped when the tensor and its views go. Writing to it
        changes only this process's copy. None where they are not stored so, the platform has no
        private mappings or the bytes are not aligned to the element size (the caller then reads).
        docs/engine.md, "CPU memory"."""
        stored = self.dtype(names[0])
        spans = [self._entries[n]["data_offsets"] for n in names]
        for n, (begin, end) in zip(names, spans, strict=True):
            if self.dtype(n) != stored or end - begin != stored.itemsize * math.prod(self.shape(n)):
                return None
        if any(spans[i][1] != spans[i + 1][0] for i in range(len(spans) - 1)):
            return None
        return self._map(spans[0][0], spans[-1][1], stored)

    def _map(self, begin: int, end: int, stored: torch.dtype) -> torch.Tensor | None:
        start = self._base + begin
        if not hasattr(mmap, "MAP_PRIVATE") or start % stored.itemsize or end <= begin:
            return None
        page = start - start % mmap.ALLOCATIONGRANULARITY
        try:
            region = mmap.mmap(
                self._file.fileno(),
                self._base + end - page,
                flags=mmap.MAP_PRIVATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
                offset=page,
            )
        except (OSError, ValueError):  # past the end of a truncated file, or a file system without mmap
            return None
        if hasattr(region, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
            region.madvise(mmap.MADV_WILLNEED)  # start reading ahead what is not cached yet
        # The tensor keeps ``region`` alive; it is unmapped when the tensor and its views go.
        return torch.frombuffer(region, dtype=stored, count=(end - begin) // stored.itemsize, offset=start - page)

    def get_tensor(self, name: str) -> torch.Tensor:
        """A new CPU tensor holding ``name``."""
        out = torch.empty(self.shape(name), dtype=self.dtype(name))
        self._read(name, out)
        return out

    def row_pieces(self, name: str, piece_bytes: int = 8 << 20) -> Iterator[tuple[int, torch.Tensor]]:
        """A 2-D tensor ``name`` as (first row, rows) pieces of about ``piece_bytes``, read into one
        reused buffer (each piece is valid until the next is read)."""
        stored, shape = self.dtype(name), self.shape(name)
        begin, end = self._entries[name]["data_offsets"]
        if len(shape) != 2:
            raise WeightsError(f"{self.path}: tensor {name} has shape {shape}, expected a table of rows")
        row_bytes = shape[1] * stored.itemsize
        if end - begin != shape[0] * row_bytes:
            raise WeightsError(f"{self.path}: tensor {name} is truncated (an interrupted download?)")
        rows = max(1, piece_bytes // max(1, row_bytes))
        piece = torch.empty(min(rows, shape[0]), shape[1], dtype=stored)
        self._file.seek(self._base + begin)
        for start in range(0, shape[0], rows):
            part = piece[: min(rows, shape[0] - start)]
            buffer = part.view(-1).view(torch.uint8).numpy()
            if self._file.readinto(buffer) != buffer.nbytes:
                raise WeightsError(f"{self.path}: tensor {name} is truncated (an interrupted download?)")
            yield start, part

    def read_as_half(self, name: str, piece_bytes: int = 8 << 20) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """A 16-bit 2-D tensor ``name`` as a new float16 tensor, read in pieces of rows so that the stored
        copy is never whole beside it (an embedding table: docs/engine.md, "CPU memory"); with a 0-d
        bool (every value finite) and its largest magnitude. None, keeping nothing, where a value does
        not fit float16's range (the caller then reads it as stored)."""
        shape = self.shape(name)
        if self.dtype(name) not in (torch.float16, torch.bfloat16) or len(shape) != 2:
            return None
        out = torch.empty(shape, dtype=torch.float16)
        finite = torch.ones((), dtype=torch.bool)
        largest = 0.0
        for start, part in self.row_pieces(name, piece_bytes):
            low, high = torch.aminmax(part)
            finite &= low.isfinite() & high.isfinite()
            largest = max(largest, -float(low), float(high))
            if not largest < 65504 and bool(finite):  # beyond float16: not held in half after all
                return None
            out[start : start + part.shape[0]].copy_(part)
        return out, finite, largest

    def read_into(self, name: str, target: torch.Tensor) -> bool:
        """Read ``name`` straight into ``target`` if it is a contiguous CPU tensor of the stored dtype and
        shape (no intermediate copy); False, reading nothing, otherwise."""
        if (
            target.device.type != "cpu"
            or target.dtype != self.dtype(name)
            or tuple(target.shape) != self.shape(name)
            or not target.is_contiguous()
        ):
            return False
        self._read(name, target)
        return True
