"""Rotary position embedding for the decoder (docs/model.md §6.2).

The checkpoint's config describes *interleaved MRoPE* with sections ``[24, 20, 20]``: frequency
``j`` of the 64 takes its angle from position row T, H or W depending on ``j % 3``. MRoPE exists
for images and video, where the three rows differ. For speech, every token (text and audio alike)
gets the same position in all three rows (the official ``get_rope_index`` expands one 1-D vector),
so whichever row a frequency reads, the angle is ``pos * inv_freq[j]``: interleaved MRoPE is then
exactly plain 1-D RoPE with ``pos = 0 .. S-1``. ``tests/asr/test_rope.py`` checks this against a
literal MRoPE implementation. We therefore implement only the 1-D form.

Rotation is NeoX split-half: ``x' = x * cos + rotate_half(x) * sin`` with
``rotate_half(x) = cat(-x[d/2:], x[:d/2])``. Angles are computed in float32 and cast to the
activation dtype, as the official code does.
"""

from __future__ import annotations

import torch


def inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """``theta ** (-2j / head_dim)`` for ``j < head_dim / 2``, float32 (computed as the reference does)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, ``[len(positions), head_dim]`` float32, for integer ``positions``."""
    inv = inverse_frequencies(head_dim, theta).to(positions.device)
    freqs = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., S, head_dim]`` by tables ``[S, head_dim]`` already in ``x.dtype``."""
    return x * cos + rotate_half(x) * sin
