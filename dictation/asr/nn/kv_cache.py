"""Static, preallocated key/value cache: one buffer per layer, written in place.

Allocated once for a maximum length and reused across transcriptions (it only grows), so the
decode loop never allocates and a later CUDA-graph step can capture fixed addresses.
"""

from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(
        self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (n_layers, 1, n_kv_heads, max_len, head_dim)
        self.keys = _zeros(shape, dtype, device)
        self.values = _zeros(shape, dtype, device)
        self.max_len = max_len
        # 0 .. max_len-1 on the device: the static-shape step builds its attention mask from it.
        self.positions = torch.arange(max_len, device=device)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [1, kv_heads, s, head_dim]`` at ``start``; return the cache up to ``start + s``."""
        stop = start + k.shape[2]
        if stop > self.max_len:
            raise RuntimeError(f"KV cache overflow: {stop} > {self.max_len}")
        self.keys[layer, :, :, start:stop] = k
        self.values[layer, :, :, start:stop] = v
        return self.keys[layer, :, :, :stop], self.values[layer, :, :, :stop]

    def write_at(
        self, layer: int, position: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [1, kv_heads, s, head_dim]`` at the device indices ``position [s]`` (no host read,
        so a CUDA graph can replay it); return the whole layer ``[1, kv_heads, max_len, hd]``."""
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(2, position, k)
        values.index_copy_(2, position, v)
        return keys, values

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cache of one layer, keys and values ``[1, kv_heads, max_len, head_dim]`` (contiguous)."""
        return self.keys[layer], self.values[layer]

    def upto(self, layer: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values at positions ``0 .. stop-1`` (what :meth:`write` returns)."""
        if stop > self.max_len:
            raise RuntimeError(f"KV cache overflow: {stop} > {self.max_len}")
        return self.keys[layer, :, :, :stop], self.values[layer, :, :, :stop]

    def copy_from(self, other: StaticKVCache) -> None:
        """Copy a smaller cache's contents into this one (used when the cache grows)."""
        n = min(other.max_len, self.max_len)
        self.keys[..., :n, :] = other.keys[..., :n, :]
        self.values[..., :n, :] = other.values[..., :n, :]

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + self.positions.nbytes


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros. On the CPU they are an anonymous memory map rather than a filled buffer: the kernel
    gives a page memory only once a position in it is written, so a cache sized for a long utterance
    (the app warms up with 1024 positions, 235 MB for the 0.6B in fp32) holds only what a dictation
    writes, and every position still reads as zero (docs/engine.md, "CPU memory"). Huge pages are
    declined for the map (where transparent huge pages are "always", one written position would
    bring in 2 MB); for the same reason this is not numpy's calloc, which asks for them."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import math
    import mmap

    count = math.prod(shape)
    size = count * torch.empty((), dtype=dtype).element_size()
    buffer = mmap.mmap(-1, max(1, size))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)
