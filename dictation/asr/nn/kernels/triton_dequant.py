"""One-pass dequantization of the int4 decoder layers on CUDA, for products of many rows.

Where an int4 layer multiplies more rows than its kernels take (``quantized.KERNEL_MAX_ROWS``: the
prefill, bucketed rows, draft checks), it dequantizes its weight and runs the float matmul. In torch
that is a chain of elementwise operations, each reading and writing the whole weight: unpack the two
nibbles, stack them, convert, subtract 8, multiply by the scale, add the midpoint: about 19 bytes of
memory traffic per weight (1.4 billion weights in the 1.7B decoder). The H100 run of 2026-11-26 showed
the cost: the int4 prefill took 24-27 ms where bf16 took 7-11 (benchmarks/results/h100-2026-11-26.md).
This kernel reads each stored byte once and writes its two float weights once: 2.5 bytes per weight
in bf16 or fp16.

The result is torch's, bit for bit (``Int4Linear.torch_dequantized``): ``(q - 8) * scale`` rounded to
the dtype, plus the group midpoint, rounded again, as torch computes bf16 and fp16 arithmetic. The
kernel is compiled without floating-point contraction: Triton's default would make the product and
the sum one fused multiply-add with a single rounding. quantized.py checks that once per GPU and
dtype on a small layer (``one_pass_dequantize_usable``); where the kernel is missing or differs, the
layer keeps torch's chain, with one log line.

Tested in Triton's interpreter on the CPU and compiled ahead of time for sm_80/89/90
(tests/asr/test_triton_dequant.py).
"""

from __future__ import annotations

import functools

import torch

# Stored bytes (two weights each) per program, and its warps.
BLOCK = 1024
WARPS = 4
DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def raw_kernel():
    """The jitted kernel, built at the first use (importing triton takes about a second)."""
    import triton
    import triton.language as tl

    @triton.jit
    def int4_dequantize(w_ptr, scale_ptr, mid_ptr, out_ptr, KB, stride_s, GROUP: tl.constexpr,
                        BLOCK: tl.constexpr):  # fmt: skip
        # Program (block of bytes, row n). Byte j of row n holds inputs 2j (high nibble) and 2j + 1
        # (low), both in group 2j // GROUP (GROUP is even). w = (q - 8) * scale + mid.
        n = tl.program_id(1)
        j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = j < KB
        byte = tl.load(w_ptr + n * KB + j, mask=ok, other=0).to(tl.int32)
        group = (2 * j) // GROUP
        scale = tl.load(scale_ptr + n * stride_s + group, mask=ok, other=0.0).to(tl.float32)
        mid = tl.load(mid_ptr + n * stride_s + group, mask=ok, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        high = (((byte >> 4) - 8).to(tl.float32) * scale).to(dtype).to(tl.float32)
        low = (((byte & 15) - 8).to(tl.float32) * scale).to(dtype).to(tl.float32)
        pair = tl.interleave((high + mid).to(dtype), (low + mid).to(dtype))  # [2 * BLOCK]: 2j, 2j + 1, ...
        cols = tl.program_id(0) * 2 * BLOCK + tl.arange(0, 2 * BLOCK)
        tl.store(out_ptr + n * 2 * KB + cols, pair, mask=cols < 2 * KB)

    return int4_dequantize


def int4_dequantize(qweight: torch.Tensor, scale: torch.Tensor, mid: torch.Tensor, group: int) -> torch.Tensor:
    """``qweight [N, K/2]`` uint8 (two inputs per byte, the even one in the high nibble), ``scale`` and
    ``mid [N, K/group]`` in the output dtype (bf16 or fp16; ``mid`` the group midpoint ``zero + 8 *
    scale``) → the weight ``[N, K]`` in that dtype. Contiguous rows; ``group`` even."""
    n, kb = qweight.shape
    if (
        qweight.dtype != torch.uint8
        or scale.dtype not in DTYPES
        or mid.dtype != scale.dtype
        or group % 2
        or (2 * kb) % group
        or scale.shape != (n, 2 * kb // group)
        or mid.shape != scale.shape
        or not (qweight.is_contiguous() and scale.is_contiguous() and mid.is_contiguous())
    ):
        raise ValueError(
            f"int4_dequantize: qweight {tuple(qweight.shape)} {qweight.dtype}, scale {tuple(scale.shape)} "
            f"{scale.dtype}, mid {tuple(mid.shape)} {mid.dtype}, group {group} do not fit"
        )
    out = torch.empty(n, 2 * kb, dtype=scale.dtype, device=qweight.device)
    raw_kernel()[(-(-kb // BLOCK), n)](qweight, scale, mid, out, kb, scale.stride(0), GROUP=group, BLOCK=BLOCK,
                                       num_warps=WARPS, enable_fp_fusion=False)  # fmt: skip
    return out
