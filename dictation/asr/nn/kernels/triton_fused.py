"""Fused Triton kernels for the decoder's elementwise work, and their launchers.

Why: on a GPU the matrix products of a decode step read the weights near the memory bandwidth, but
the step also ran ~110 tiny elementwise kernels (RMSNorm as pow/mean/rsqrt/mul with dtype copies,
residual adds, RoPE mul/cat, index_copy into the KV cache, SiLU * up), about 2 ms of 5 per token on
an H100. Here each group is one kernel:

- :func:`rms_norm`: the residual add and the RMSNorm after it (one program per row);
- :func:`rope_qk_cache`: q/k RMSNorm per head + RoPE, k and v written into the KV cache, q out in
  the ``[1, heads, s, hd]`` layout attention wants (the prefill's rows);
- :func:`decode_attention`: one token's q/k norm + RoPE + cache write + attention over the filled
  part of the cache only, the position read on the device (nothing is read on the host, so a CUDA
  graph can replay it); long caches split the positions over several programs per head and a second
  kernel combines them (:func:`attention_splits`);
- :func:`silu_mul`: ``silu(gate) * up``.

Numerics follow the reference's order of roundings, so that in float32 the results equal the torch
code's up to the order of sums, and in bf16/fp16 each intermediate is rounded where torch rounds it:
RMSNorm normalises in float32, casts to the dtype, then multiplies by the weight (docs/model.md §6.1); RoPE is
``x * cos + rotate_half(x) * sin`` with each product rounded to the dtype (rope.py); SiLU rounds
before the product with ``up``. Sums and attention accumulate in float32.

Tested on the CPU in Triton's interpreter (``TRITON_INTERPRET=1``, tests/asr/test_triton_fused.py)
and compiled ahead of time for sm_80/89/90 by Triton's own compiler; dictation/asr/nn/kernels/fused.py decides
where they run (checked once per device against the torch code).
"""

from __future__ import annotations

import functools

import torch

# Elements of the decode attention's [query heads of a kv head, positions, head_dim] tile (its
# positions per iteration follow: 64 for 2 query heads per kv head and head_dim 128), and its warps.
ATTENTION_TILE = 16384
ATTENTION_WARPS = 8
# Caches up to this many positions are attended by one program per kv head (no second kernel);
# longer ones split the filled positions over several programs per kv head, about one per
# ``SPLIT_SPAN`` positions of the cache, at most ``MAX_SPLITS``, and a second kernel combines them.
SINGLE_PASS_MAX = 1024
SPLIT_SPAN = 512
MAX_SPLITS = 32
# Elements per program of the row-wise kernels (rms_norm, silu_mul): several rows in prefill.
ROW_TILE = 8192


KERNELS = ("rms_norm_rows", "rope_rows", "decode_attention", "combine_splits", "silu_mul_rows", "gemv_rows")
# (BLOCK_N, BLOCK_K, num_warps) that triton.autotune tries for gemv on the GPU (at the first call for
# each shape: the warm-up's); the first is the interpreter's.
GEMV_CONFIGS = ((8, 512, 4), (4, 1024, 4), (16, 256, 4), (16, 512, 8))


@functools.cache
def raw_kernels() -> dict:
    """The jitted kernels by name, imported at the first use (importing triton takes about a second)."""
    from dictation.asr.nn.kernels import _fused_kernels

    return {name: getattr(_fused_kernels, name) for name in KERNELS}


@functools.cache
def _gemv_autotuned():
    import triton

    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in GEMV_CONFIGS]
    return triton.autotune(configs=configs, key=["N", "K", "PROLOGUE", "RESIDUAL"])(raw_kernels()["gemv_rows"])


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """``x [..., n]`` as ``[rows, n]`` rows contiguous along n (a view; split views of a fused
    projection's output qualify)."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if rows.stride(-1) != 1:
        raise ValueError(f"{what}: the last dimension must be contiguous, got strides {tuple(x.stride())}")
    return rows


def rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + delta`` (``x`` alone without ``delta``) and ``RMSNorm(h) * weight``, both ``x``-shaped."""
    n = x.shape[-1]
    xs = _rows(x, "rms_norm x")
    ds = _rows(delta, "rms_norm delta") if delta is not None else xs
    if weight.shape != (n,) or (delta is not None and delta.shape != x.shape):
        raise ValueError(f"rms_norm: x {tuple(x.shape)}, delta, weight {tuple(weight.shape)} do not fit")
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    m, block = xs.shape[0], _pow2(n)
    rows = max(1, min(_pow2(m), ROW_TILE // block))
    raw_kernels()["rms_norm_rows"][(-(-m // rows),)](
        xs, ds, weight, h, y, m, n, xs.stride(0), ds.stride(0), eps, HAS_DELTA=delta is not None, ROWS=rows,
        BLOCK=block, num_warps=_warps(rows * block),
    )  # fmt: skip
    return h, y


def _warps(elements: int) -> int:
    """Warps for a program of ``elements`` values: about 16 per thread, a power of two, 1 to 8."""
    return min(1 << (max(elements // 512, 1).bit_length() - 1), 8)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``[..., n]`` rows (strided rows allowed, e.g. halves of one matmul)."""
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    n = gate.shape[-1]
    gs, us = _rows(gate, "silu_mul gate"), _rows(up, "silu_mul up")
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    m, block = gs.shape[0], min(_pow2(n), ROW_TILE // 2)
    rows = max(1, min(_pow2(m), ROW_TILE // 2 // block))
    raw_kernels()["silu_mul_rows"][(-(-m // rows), -(-n // block))](
        gs, us, out, m, n, gs.stride(0), us.stride(0), ROWS=rows, BLOCK=block, num_warps=_warps(rows * block)
    )
    return out


def _check_heads(q, k, v, q_weight, k_weight, key_cache, value_cache) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) of q/k/v rows ``[s, heads * hd]`` and a layer's cache ``[1, kv, max_len, hd]``."""
    hd = key_cache.shape[-1]
    heads, kv = q.shape[-1] // hd, k.shape[-1] // hd
    ok = (
        key_cache.dim() == 4
        and key_cache.shape[:2] == (1, kv)
        and key_cache.shape == value_cache.shape
        and key_cache.is_contiguous()
        and value_cache.is_contiguous()
        and q.shape[-1] == heads * hd
        and k.shape[-1] == v.shape[-1] == kv * hd
        and heads % kv == 0
        and q_weight.shape == k_weight.shape == (hd,)
        and hd == _pow2(hd)
    )
    if not ok:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, norms {tuple(q_weight.shape)}, "
            f"cache {tuple(key_cache.shape)} do not fit"
        )
    return heads, kv, hd


def rope_qk_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    start: int,
    eps: float,
) -> torch.Tensor:
    """Rows ``q [1, s, heads * hd]``, ``k``/``v [1, s, kv * hd]`` at positions ``start ..``, with
    the tables' rows for those positions ``cos``/``sin [s, hd]``: k (normed, rotated) and v go into
    the layer's cache ``[1, kv, max_len, hd]``; returns q normed and rotated, ``[1, heads, s, hd]``."""
    heads, kv, hd = _check_heads(q, k, v, q_weight, k_weight, key_cache, value_cache)
    qs, ks, vs = _rows(q, "q"), _rows(k, "k"), _rows(v, "v")
    s = qs.shape[0]
    if start + s > key_cache.shape[2] or cos.shape != (s, hd) or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(
            f"rope_qk_cache: {s} rows at {start}, tables {tuple(cos.shape)}, cache {tuple(key_cache.shape)}"
        )
    q_out = torch.empty(1, heads, s, hd, dtype=q.dtype, device=q.device)
    raw_kernels()["rope_rows"][(s,)](
        qs, ks, vs, q_weight, k_weight, cos, sin, q_out, key_cache, value_cache, s, start, qs.stride(0), ks.stride(0),
        vs.stride(0), key_cache.stride(1), eps, HEADS=heads, HEADS_P2=_pow2(heads), KV=kv, KV_P2=_pow2(kv), HD=hd,
        num_warps=_warps((heads + kv) * hd),
    )  # fmt: skip
    return q_out


def attention_splits(max_len: int) -> int:
    """Programs per query head of the decode attention for a cache of ``max_len`` positions."""
    if max_len <= SINGLE_PASS_MAX:
        return 1
    return min(-(-max_len // SPLIT_SPAN), MAX_SPLITS)


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    position: torch.Tensor,
    eps: float,
    splits: int | None = None,
) -> torch.Tensor:
    """One token: ``q [.., heads * hd]``, ``k``/``v [.., kv * hd]`` (one row each) at the device
    position ``position [1]`` (int64), with the whole tables ``cos``/``sin [max_len, hd]``: q and k
    normed and rotated, k/v written into the layer's cache ``[1, kv, max_len, hd]``, and attention
    over positions ``0 .. position``. Returns ``[1, 1, heads * hd]``. The caller keeps
    ``position < max_len``. ``splits``: :func:`attention_splits` of the cache unless given."""
    heads, kv, hd = _check_heads(q, k, v, q_weight, k_weight, key_cache, value_cache)
    qs, ks, vs = _rows(q, "q"), _rows(k, "k"), _rows(v, "v")
    max_len = key_cache.shape[2]
    if qs.shape[0] != 1 or cos.shape != (max_len, hd) or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"decode_attention: q {tuple(q.shape)}, tables {tuple(cos.shape)}, cache {max_len} positions")
    splits = attention_splits(max_len) if splits is None else splits
    out = torch.empty(1, 1, heads * hd, dtype=q.dtype, device=q.device)
    if splits > 1:
        acc = torch.empty(heads, splits, hd, dtype=torch.float32, device=q.device)
        ml = torch.empty(heads, splits, 2, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # not written
    group = heads // kv
    block = max(16, ATTENTION_TILE // (_pow2(group) * hd))
    kernels = raw_kernels()
    kernels["decode_attention"][(kv, splits)](
        qs, ks, vs, q_weight, k_weight, cos, sin, key_cache, value_cache, position, out, acc, ml,
        key_cache.stride(1), eps, hd**-0.5, GROUP=group, GROUP_P2=_pow2(group), HD=hd, SPLITS=splits, BLOCK=block,
        num_warps=ATTENTION_WARPS,
    )  # fmt: skip
    if splits > 1:
        kernels["combine_splits"][(heads,)](acc, ml, out, SPLITS=splits, SPLITS_P2=_pow2(splits), HD=hd, num_warps=2)
    return out


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    silu: bool,
    block: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """One row ``x [.., k_in]`` times ``weight [n, k].T`` with the elementwise work before and after
    it: ``norm_weight``: x goes through RMSNorm first (``eps``); ``silu``: x is ``[gate, up]`` (2k)
    and ``silu(gate) * up`` goes in; ``residual [.., n]``: added to the product. Returns ``[1, 1, n]``
    in x's dtype. ``block``: one of ``GEMV_CONFIGS`` instead of the autotuned choice."""
    import os

    n, k = weight.shape
    xs = _rows(x, "gemv x")
    if (
        xs.shape != (1, 2 * k if silu else k)
        or not weight.is_contiguous()
        or not xs.is_contiguous()
        or (norm_weight is not None and (silu or norm_weight.shape != (k,)))
        or (residual is not None and residual.numel() != n)
    ):
        raise ValueError(f"gemv: x {tuple(x.shape)}, weight {tuple(weight.shape)}, silu={silu} do not fit")
    y = torch.empty(1, 1, n, dtype=x.dtype, device=x.device)
    prologue = 1 if norm_weight is not None else 2 if silu else 0
    args = (xs, weight, y, residual if residual is not None else y, norm_weight if norm_weight is not None else xs)
    if block is None and os.environ.get("TRITON_INTERPRET") == "1":
        block = GEMV_CONFIGS[0]  # the interpreter cannot time the autotune candidates
    if block is not None:
        block_n, block_k, warps = block
        raw_kernels()["gemv_rows"][(-(-n // block_n),)](
            *args, n, k, eps, PROLOGUE=prologue, RESIDUAL=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps,
        )  # fmt: skip
    else:
        _gemv_autotuned()[lambda meta: (-(-n // meta["BLOCK_N"]),)](
            *args, n, k, eps, PROLOGUE=prologue, RESIDUAL=residual is not None
        )
    return y
