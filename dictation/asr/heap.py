"""The C heap's free pages, handed back to the system; a mapped file's pages, out of the resident set."""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; a no-op elsewhere).
    Loading frees many tensors between a few and 30 MB that glibc keeps in its heap rather than
    unmapping (its mmap threshold rises with each large free): about 0.2 GB of resident memory for the
    0.6B model that nothing uses (docs/engine.md, "CPU memory")."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, looked up once; None off Linux or without glibc (musl has none)."""
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


MADV_DONTNEED = 4  # Linux's value on every architecture torch runs on


def file_page_dropper(tensor: torch.Tensor) -> Callable[[torch.Tensor], int] | None:
    """Where ``tensor`` is an unwritten private mapping of a file (TensorReader.map_run) on Linux: a
    function that takes the whole pages of a piece of it out of this process's resident memory (they
    stay in the page cache and come back, with the same bytes, when next read) and returns the bytes
    dropped. None anywhere else: a copy in the process's own memory (which ``MADV_DONTNEED`` would
    zero), a written page, another platform.

    For a tensor read whole once (the int8 head's table, quantized at load) and from then on a few rows
    at a time: counted as resident, its pages would overstate what the process holds."""
    if sys.platform != "linux" or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    madvise = _madvise()
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    if madvise is None or end <= start or not _private_file_mapping(start, end):
        return None

    def drop(piece: torch.Tensor) -> int:
        begin = piece.data_ptr()
        finish = begin + piece.numel() * piece.element_size()
        if not (start <= begin and finish <= end and piece.is_contiguous()):
            raise ValueError("a piece to drop must be a contiguous part of the tensor")
        page = mmap.PAGESIZE
        low, high = -(-begin // page) * page, finish // page * page  # whole pages: neighbours keep theirs
        if high <= low or madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_DONTNEED) != 0:
            return 0
        return high - low

    return drop


def _private_file_mapping(low: int, high: int) -> bool:
    """Whether [low, high) lies in one private, file-backed mapping that was never written
    (/proc/self/smaps: a written page would be anonymous, its changes lost to MADV_DONTNEED)."""
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
            inside = False
            for line in smaps:
                fields = line.split()
                if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                    begin, finish = (int(x, 16) for x in fields[0].split("-"))
                    inside = begin <= low and high <= finish
                    if inside and (len(fields) < 6 or not fields[1].endswith("p") or fields[4] == "0"):
                        return False  # anonymous or shared: not a private file mapping
                elif inside and fields[0] == "Anonymous:":
                    return int(fields[1]) == 0
    except OSError:
        return False
    return False


@functools.cache
def _madvise():
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


class Arena:
    """Tensors placed back to back in one fresh anonymous mapping, each with a storage of its own
    (docs/engine.md, "CPU memory"). The decoder's integer weights live in one on the CPU: a decode
    step streams them all, and the same int8 matrix-vector products read them 15-20 % faster there
    than from the C heap's recycled pages (measured on the 0.6B's 112 matrices, 2 threads: 23.3 against
    28.7 ms), where a loaded model's tensors otherwise land. Pages are given by the kernel as they are
    first written (loading). Not asked to be huge pages: where the kernel compacts memory for them on
    request, each first write stalled on it, and the load of the 0.6B took 1.5-2.2 s instead of 0.4-1.3.
    The mapping goes when the last tensor placed in it does."""

    ALIGN = 64
    MADV_COLLAPSE = 25  # Linux 6.1 and later (Python's mmap module names it from 3.12 or not at all)

    def __init__(self, nbytes: int) -> None:
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
        self._map = mmap.mmap(-1, max(1, nbytes), flags=flags)
        self._size = nbytes
        self._used = 0

    @staticmethod
    def bytes_for(shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """What :meth:`take` uses of the arena for one tensor, alignment included."""
        import math

        n = math.prod(shape) * dtype.itemsize
        return -(-n // Arena.ALIGN) * Arena.ALIGN

    def collapse(self) -> bool:
        """Ask the kernel to move the arena's pages into huge pages now (``MADV_COLLAPSE``), in place:
        the same addresses, fewer TLB misses for a step that streams them. A one-time copy (the app's
        warm-up pays it); False where the kernel refuses (older than 6.1, no huge pages)."""
        try:
            self._map.madvise(self.MADV_COLLAPSE)
        except (OSError, ValueError):
            return False
        return True

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of the arena's next bytes: its storage exactly its own bytes (the
        padding to the next tensor belongs to none), so fused rows and shared-storage checks see it
        as any tensor of its own."""
        import math

        import torch

        need = self.bytes_for(shape, dtype)
        if self._used + need > self._size:
            raise ValueError(f"the arena has {self._size - self._used} bytes left, {need} asked for")
        start = self._used
        self._used += need
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(memoryview(self._map)[start : start + nbytes], dtype=dtype).view(shape)
