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
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [1, kv_heads, s, head_dim]`` at ``start``; return the cache up to ``start + s``."""
        stop = start + k.shape[2]
        if stop > self.max_len:
            raise RuntimeError(f"KV cache overflow: {stop} > {self.max_len}")
        self.keys[layer, :, :, start:stop] = k
        self.values[layer, :, :, start:stop] = v
        return self.keys[layer, :, :, :stop], self.values[layer, :, :, :stop]

    def copy_from(self, other: StaticKVCache) -> None:
        """Copy a smaller cache's contents into this one (used when the cache grows)."""
        n = min(other.max_len, self.max_len)
        self.keys[..., :n, :] = other.keys[..., :n, :]
        self.values[..., :n, :] = other.values[..., :n, :]

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes
