"""Triton kernels for the int8 and int4 decoder layers on CUDA at decode time (a few rows).

Why: torch has no good CUDA kernel for weight-only int8 with one activation row. Before 2.9 there
is none, and dequantize + matmul moves about 5 bytes per weight (read int8, write and read bf16)
where bf16 moves 2, so int8 decodes slower than bf16. torch 2.9 added ``_weight_int8pack_mm`` for
CUDA, with one thread per output and a serial loop over the inputs. This kernel reads each int8
weight once, coalesced along the input features, and accumulates in float32: the traffic of a
matrix-vector product over int8, about half of bf16's.

The int4 kernel (:func:`int4_matmul`) follows the same design on quantized.py's stored layout (no
kernel layout beside it, unlike torch's tinygemm, whose packed copy is another 0.8 GB for the 1.7B
model): it reads the nibbles as 32-bit words (16-byte vectors per thread on aligned layers), and
turns each nibble into a float without an integer-to-float conversion, which an H100 runs at 16
per clock per SM, too few for two per byte at 3.35 TB/s: the nibble is masked in place into the
mantissa of 2**23 (one and-or) and 2**23 subtracted, its power-of-two position folded into x. Each
group's products are summed before its scale and zero are applied, in float32.

Each is one candidate among three (quantized.py): used on a GPU only where it answers right and is the
fastest there, measured once per process (``quant.cuda_int8_path`` / ``cuda_int4_path``). Block
sizes are tuned by ``triton.autotune`` on the GPU at the first call for each layer shape (the
warm-up's).

Triton ships with torch's CUDA wheels on Linux; elsewhere :func:`available` is False. The tests run
the kernels on the CPU in Triton's interpreter (``TRITON_INTERPRET=1``, tests/asr/test_triton_gemv.py)
and compile them ahead of time for sm_80/89/90 (checking their loads and conversions in the PTX).
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
# The same for the int4 kernel; BLOCK_K (inputs per step) is a multiple of the largest group size (256).
# Small BLOCK_N keeps enough programs in flight for the narrow layers (2048 outputs), long BLOCK_K
# puts many loads in flight per program.
INT4_CONFIGS = ((4, 2048, 4), (8, 1024, 4), (16, 512, 4), (32, 256, 4), (16, 1024, 8), (64, 256, 8))


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
def raw_int4_kernel():
    """The int4 kernel with explicit block sizes (see :func:`int4_matmul`)."""
    import triton
    import triton.language as tl

    @triton.jit
    def int4_rows(x_ptr, w_ptr, scale_ptr, zero_ptr, y_ptr, N, KW, stride_x, stride_w, stride_s, stride_y,
                  GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
        # One program: BLOCK_N outputs of one row. The weights come as 32-bit words of 8 nibbles
        # (bytes little-endian, each byte's high nibble the even input): nibble i of a word (bits
        # 4i..4i+3) is input 8 * word + (i ^ 1). Per group: y += scale * sum(q * x) + zero * sum(x).
        m = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        WORDS: tl.constexpr = BLOCK_K // 8
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        acc = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
        for first in range(0, KW, WORDS):  # KW = K / 8 words per row (a whole number of groups)
            words = first + tl.arange(0, WORDS)
            word_ok = words < KW
            packed = tl.load(w_ptr + rows[:, None] * stride_w + words[None, :], mask=row_ok[:, None] & word_ok[None, :],
                             other=0).to(tl.uint32, bitcast=True)  # fmt: skip
            high = packed >> 16
            part = tl.zeros((BLOCK_N, WORDS), dtype=tl.float32)
            xsum = tl.zeros((WORDS,), dtype=tl.float32)
            for i in tl.static_range(8):
                x = tl.load(x_ptr + m * stride_x + words * 8 + (i ^ 1), mask=word_ok, other=0.0).to(tl.float32)
                xsum += x
                # The nibble stays in place inside the mantissa of 2**23 (exact for bits 0..22): the
                # float is 2**23 + q * 2**shift, so q costs one and-or and one subtraction, no integer
                # to float conversion; x carries the 2**-shift instead.
                shift = 4 * (i % 4)
                bits = (high if i >= 4 else packed) & (15 << shift)
                q = (bits | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
                part += q * (x * (1.0 / (1 << shift)))[None, :]
            sums = tl.sum(tl.reshape(part, (BLOCK_N, GROUPS, GROUP // 8)), axis=2)
            xs = tl.sum(tl.reshape(xsum, (GROUPS, GROUP // 8)), axis=1)
            groups = first // (GROUP // 8) + tl.arange(0, GROUPS)
            sz_mask = row_ok[:, None] & (groups < KW // (GROUP // 8))[None, :]
            sz = rows[:, None] * stride_s + groups[None, :]
            scale = tl.load(scale_ptr + sz, mask=sz_mask, other=0.0).to(tl.float32)
            zero = tl.load(zero_ptr + sz, mask=sz_mask, other=0.0).to(tl.float32)
            acc += scale * sums + zero * xs[None, :]
        y = tl.sum(acc, axis=1)
        tl.store(y_ptr + m * stride_y + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)

    return int4_rows


@functools.cache
def _kernel():
    """The kernel with its block sizes picked by triton.autotune per (N, K), on the GPU it runs on."""
    import triton

    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in CONFIGS]
    return triton.autotune(configs=configs, key=["N", "K"])(raw_kernel())


@functools.cache
def available() -> bool:
    """Whether Triton can be imported (its CUDA use is checked by quantized.py's probe)."""
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


@functools.cache
def _int4_kernel():
    import triton

    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in INT4_CONFIGS]
    return triton.autotune(configs=configs, key=["N", "KW", "GROUP"])(raw_int4_kernel())


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    block: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """``x [M, K]`` (float) times the int4 weight in quantized.py's stored format: ``qweight [N, K/2]``
    uint8 (two inputs per byte, the even one in the high nibble), ``scales`` and ``zeros``
    ``[N, K/group]`` (any float dtype; ``w = q * scale + zero``): ``[M, N]`` in x's dtype. Rows must be
    contiguous along K; K a multiple of 8. ``block``: one of ``INT4_CONFIGS`` instead of autotune."""
    m, k = x.shape
    n = qweight.shape[0]
    groups = scales.shape[1] if scales.dim() == 2 else 0
    group = k // groups if groups and k % groups == 0 else 0
    if (
        qweight.dtype != torch.uint8
        or k % 8
        or qweight.shape[1] * 2 != k
        or group not in (32, 64, 128, 256)
        or scales.shape != (n, groups)
        or zeros.shape != scales.shape
        or zeros.stride() != scales.stride()
        or x.stride(1) != 1
        or qweight.stride(1) != 1
        or scales.stride(1) != 1
        or qweight.storage_offset() % 4
        or qweight.stride(0) % 4
    ):
        raise ValueError(
            f"int4_matmul: x {tuple(x.shape)}, qweight {tuple(qweight.shape)} {qweight.dtype}, scales "
            f"{tuple(scales.shape)}, zeros {tuple(zeros.shape)} do not fit"
        )
    words = qweight.view(torch.int32)  # 8 nibbles per word (stride and offset checked above)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    args = (x, words, scales, zeros, y, n, k // 8, x.stride(0), words.stride(0), scales.stride(0), y.stride(0))
    if block is None and os.environ.get("TRITON_INTERPRET") == "1":
        block = INT4_CONFIGS[1]
    if block is not None:
        block_n, block_k, warps = block
        kernel = raw_int4_kernel()[(-(-n // block_n), m)]
        kernel(*args, GROUP=group, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    else:
        _int4_kernel()[lambda meta: (-(-n // meta["BLOCK_N"]), m)](*args, GROUP=group)
    return y
