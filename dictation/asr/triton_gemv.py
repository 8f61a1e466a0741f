"""A Triton kernel for the int8 decoder layers on CUDA at decode time (a few rows).

Why: torch has no good CUDA kernel for weight-only int8 with one activation row. Before 2.9 there
is none, and dequantize + matmul moves about 5 bytes per weight (read int8, write and read bf16)
where bf16 moves 2, so int8 decodes slower than bf16. torch 2.9 added ``_weight_int8pack_mm`` for
CUDA, with one thread per output and a serial loop over the inputs. This kernel reads each int8
weight once, coalesced along the input features, and accumulates in float32: the traffic of a
matrix-vector product over int8, about half of bf16's.

It is one candidate among three (quant.py): it is used on a GPU only where it answers right and
is the fastest there, measured once per process (``quant.cuda_int8_path``). Block sizes are tuned
by ``triton.autotune`` on the GPU at the first call for each layer shape (the warm-up's).

Triton ships with torch's CUDA wheels on Linux; elsewhere :func:`available` is False. The tests run
the kernel on the CPU in Triton's interpreter (``TRITON_INTERPRET=1``, tests/asr/test_triton_gemv.py).
"""

from __future__ import annotations

import functools
import logging
import os

import torch

log = logging.getLogger(__name__)

# Rows up to which the kernel is used: each row reads the weights again (from L2 at best), so a
# few rows at most; more go to dequantize + matmul.
MAX_ROWS = 4


# (BLOCK_N, BLOCK_K, num_warps) that triton.autotune tries on the GPU.
CONFIGS = ((4, 1024, 4), (8, 512, 4), (16, 256, 4), (32, 256, 8), (64, 128, 8))


@functools.cache
def raw_kernel():
    """The jitted kernel with explicit block sizes, built at the first use (importing triton takes
    about a second). What the tests run, for every one of ``CONFIGS``."""
    import triton
    import triton.language as tl

    @triton.jit
    def int8_rows(x_ptr, w_ptr, scale_ptr, y_ptr, N, K, stride_x, stride_w, stride_y, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):  # fmt: skip
        # One program: BLOCK_N outputs of one row. y[m, n] = scale[n] * sum_k x[m, k] * w[n, k].
        m = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            col_ok = cols < K
            x = tl.load(x_ptr + m * stride_x + cols, mask=col_ok, other=0.0).to(tl.float32)
            tile = rows[:, None] * stride_w + cols[None, :]
            w = tl.load(w_ptr + tile, mask=row_ok[:, None] & col_ok[None, :], other=0)
            acc += w.to(tl.float32) * x[None, :]
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
        y = tl.sum(acc, axis=1) * scale
        tl.store(y_ptr + m * stride_y + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)

    return int8_rows


@functools.cache
def _kernel():
    """The kernel with its block sizes picked by triton.autotune per (N, K), on the GPU it runs on."""
    import triton

    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in CONFIGS]
    return triton.autotune(configs=configs, key=["N", "K"])(raw_kernel())


@functools.cache
def available() -> bool:
    """Whether Triton can be imported (its CUDA use is checked by quant.py's probe)."""
    try:
        _kernel()
    except Exception as exc:  # ImportError, or a Triton too old for this code
        log.info("no Triton int8 kernel (%s)", exc)
        return False
    return True


def int8_matmul(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int, int] | None = None
) -> torch.Tensor:
    """``x [M, K]`` (float) times the int8 ``weight [N, K]`` with per-output ``scale [N]`` (float32):
    ``[M, N]`` in x's dtype. Rows of x and of weight must be contiguous along K. ``block``: one of
    ``CONFIGS`` instead of the autotuned choice (the tests)."""
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or scale.shape != (n,) or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(
            f"int8_matmul: x {tuple(x.shape)}, weight {tuple(weight.shape)}, scale {tuple(scale.shape)} do not fit"
        )
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    args = (x, weight, scale, y, n, k, x.stride(0), weight.stride(0), y.stride(0))
    if block is None and os.environ.get("TRITON_INTERPRET") == "1":
        block = CONFIGS[0]  # Triton's CPU interpreter cannot time the autotune candidates
    if block is not None:
        block_n, block_k, warps = block
        raw_kernel()[(-(-n // block_n), m)](*args, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    else:
        _kernel()[lambda meta: (-(-n // meta["BLOCK_N"]), m)](*args)
    return y
