"""The C heap's free pages, handed back to the system."""

from __future__ import annotations

import ctypes
import functools
import sys


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
