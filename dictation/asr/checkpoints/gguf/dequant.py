"""GGUF block types dequantized with torch on the target device, bit-identical to gguf-py (table: ``__init__``)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from dictation.asr.checkpoints.gguf.reader import _FLOAT_DTYPES, SUPPORTED_TYPES, TensorType


def _f16_column(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte ``start`` of every block → float32 ``[n_blocks, 1]``."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _shifts(values: Iterable[int], shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.uint8, device=device).view(shape)


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12-byte field of Q4_K/Q5_K → 6-bit (scale, min) per 32-value sub-block, ``[n, 8]`` each.

    Bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3, 8-11 the low nibbles of scales 4-7 and
    (high nibble) of mins 4-7; the top two bits of bytes 0-3 / 4-7 are bits 4-5 of scales / mins 4-7.
    """
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([a & 63, (c & 15) | ((a >> 2) & 48)], dim=1)
    mins = torch.cat([b & 63, (c >> 4) | ((b >> 2) & 48)], dim=1)
    return scales.float(), mins.float()


def _dequant_q8_0(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][32 x int8]; value = q * d
    dst.copy_(blocks[:, 2:].view(torch.int8))
    dst.mul_(_f16_column(blocks, 0))


def _nibbles32(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes per block → its 32 4-bit values ``uint8 [n, 32]``: low nibbles first, then high nibbles."""
    n = qs.shape[0]
    return ((qs.reshape(n, 1, 16) >> _shifts((0, 4), (1, 2, 1), qs.device)) & 15).view(n, 32)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """A little-endian 32-bit field (4 bytes per block) → its bits ``uint8 [n, 32]``, bit i at index i."""
    n = qh.shape[0]
    return ((qh.reshape(n, 4, 1) >> _shifts(range(8), (1, 1, 8), qh.device)) & 1).view(n, 32)


def _dequant_q4_0(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][qs: 16]; value = d * (q - 8)
    dst.copy_(_nibbles32(blocks[:, 2:18]))
    dst.sub_(8.0).mul_(_f16_column(blocks, 0))


def _dequant_q4_1(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][m: f16][qs: 16]; value = d * q + m (two roundings, as gguf-py: no fused multiply-add)
    dst.copy_(_nibbles32(blocks[:, 4:20]))
    dst.mul_(_f16_column(blocks, 0)).add_(_f16_column(blocks, 2))


def _dequant_q5_0(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][qh: u32][qs: 16]; bit i of qh is bit 4 of value i; value = d * (q - 16)
    dst.copy_(_nibbles32(blocks[:, 6:22]) | (_bits32(blocks[:, 2:6]) << 4))
    dst.sub_(16.0).mul_(_f16_column(blocks, 0))


def _dequant_q5_1(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][m: f16][qh: u32][qs: 16]; value = d * q + m
    dst.copy_(_nibbles32(blocks[:, 8:24]) | (_bits32(blocks[:, 4:8]) << 4))
    dst.mul_(_f16_column(blocks, 0)).add_(_f16_column(blocks, 2))


def _dequant_q3_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [hmask: 32][qs: 64][scales: 12][d: f16]; 16 sub-blocks of 16: value = (d*(sc-32)) * q, q in -4..3.
    # Each half of 128 values takes qs[32h:32h+32], 2-bit pairs from bit 0 upwards in 32-value runs;
    # bit j of hmask[l] belongs to value 32j+l: set → q = low bits, clear → q = low bits - 4.
    # Scales: bytes 0-7 low nibbles = low 4 bits of scales 0-7, high nibbles of scales 8-15; bytes 8-11
    # hold bits 4-5, 2-bit pairs from bit 0 upwards (pair k of byte b is scale 4k+b).
    n = blocks.shape[0]
    dev = blocks.device
    low = (blocks[:, 32:96].reshape(n, 2, 1, 32) >> _shifts((0, 2, 4, 6), (1, 1, 4, 1), dev)) & 3
    high = (blocks[:, 0:32].reshape(n, 1, 32) >> _shifts(range(8), (1, 8, 1), dev)) & 1
    lo_sc, hi_sc = blocks[:, 96:104], blocks[:, 104:108]
    sc = torch.cat([lo_sc & 15, lo_sc >> 4], dim=1) | (
        ((hi_sc.reshape(n, 1, 4) >> _shifts((0, 2, 4, 6), (1, 4, 1), dev)) & 3).view(n, 16) << 4
    )
    out = dst.view(n, 16, 16)
    out.copy_((low.view(n, 8, 32) | (high << 2)).view(n, 16, 16))
    d = _f16_column(blocks, 108)
    out.sub_(4.0).mul_((d * sc.float().sub_(32.0)).unsqueeze(-1))


def _dequant_q4_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][dmin: f16][scales: 12][qs: 128]; 8 sub-blocks of 32: value = (d*sc)*q - dmin*m.
    # Sub-block 2j takes the low nibbles of qs[32j:32j+32], sub-block 2j+1 the high nibbles.
    n = blocks.shape[0]
    d, dmin = _f16_column(blocks, 0), _f16_column(blocks, 2)
    sc, m = _k_scales(blocks[:, 4:16])
    q = (blocks[:, 16:144].reshape(n, 4, 1, 32) >> _shifts((0, 4), (1, 1, 2, 1), blocks.device)) & 15
    out = dst.view(n, 8, 32)
    out.copy_(q.view(n, 8, 32))
    out.mul_((d * sc).unsqueeze(-1)).sub_((dmin * m).unsqueeze(-1))


def _dequant_q5_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d][dmin][scales: 12][qh: 32][qs: 128]; like Q4_K with a fifth bit: bit j of qh[l] is the
    # high bit of value l of sub-block j.
    n = blocks.shape[0]
    d, dmin = _f16_column(blocks, 0), _f16_column(blocks, 2)
    sc, m = _k_scales(blocks[:, 4:16])
    low = (blocks[:, 48:176].reshape(n, 4, 1, 32) >> _shifts((0, 4), (1, 1, 2, 1), blocks.device)) & 15
    high = (blocks[:, 16:48].reshape(n, 1, 32) >> _shifts(range(8), (1, 8, 1), blocks.device)) & 1
    out = dst.view(n, 8, 32)
    out.copy_(low.view(n, 8, 32) | (high << 4))
    out.mul_((d * sc).unsqueeze(-1)).sub_((dmin * m).unsqueeze(-1))


def _dequant_q6_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [ql: 128][qh: 64][scales: 16 x int8][d: f16]; 16 sub-blocks of 16: value = (d*sc)*(q - 32).
    # Each half of 128 values: ql[64h:64h+64] low nibbles then high nibbles, 2-bit pairs of
    # qh[32h:32h+32] from bit 0 upwards, in 32-value runs.
    n = blocks.shape[0]
    low = (blocks[:, 0:128].reshape(n, 2, 1, 64) >> _shifts((0, 4), (1, 1, 2, 1), blocks.device)) & 15
    high = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> _shifts((0, 2, 4, 6), (1, 1, 4, 1), blocks.device)) & 3
    out = dst.view(n, 16, 16)
    out.copy_((low.view(n, 8, 32) | (high.view(n, 8, 32) << 4)).view(n, 16, 16))
    d = _f16_column(blocks, 208)
    out.sub_(32.0).mul_((d * blocks[:, 192:208].view(torch.int8).float()).unsqueeze(-1))


_DEQUANT = {
    "Q8_0": _dequant_q8_0,
    "Q4_0": _dequant_q4_0,
    "Q4_1": _dequant_q4_1,
    "Q5_0": _dequant_q5_0,
    "Q5_1": _dequant_q5_1,
    "Q3_K": _dequant_q3_k,
    "Q4_K": _dequant_q4_k,
    "Q5_K": _dequant_q5_k,
    "Q6_K": _dequant_q6_k,
}
_CHUNK_VALUES = 1 << 22  # values per dequantization step (float32 temporaries of 16 MB)


def dequantize_blocks(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """Quantized blocks ``uint8 [n_blocks, type_size]`` (any device) → float32 values, flat.

    Exactly the values gguf-py's ``gguf.quants.dequantize`` computes (the same float32 operations
    in the same order).
    """
    kind = next((t for t in SUPPORTED_TYPES.values() if t.name == type_name and t.name in _DEQUANT), None)
    if kind is None:
        raise ValueError(f"no dequantizer for {type_name}")
    dst = torch.empty(blocks.shape[0], kind.block_size, dtype=torch.float32, device=blocks.device)
    _DEQUANT[type_name](blocks, dst)
    return dst.view(-1)


def dequantize(raw: np.ndarray, kind: TensorType, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A tensor's bytes (host memory) → a new flat tensor of ``dtype`` on ``device``."""
    src = torch.from_numpy(raw)
    if kind.name in _FLOAT_DTYPES:
        return src.view(_FLOAT_DTYPES[kind.name]).to(device, copy=True).to(dtype)
    blocks = src.view(-1, kind.type_size)
    out = torch.empty(blocks.shape[0], kind.block_size, dtype=dtype, device=device)
    step = max(1, _CHUNK_VALUES // kind.block_size)
    scratch = None if dtype == torch.float32 else torch.empty(step, kind.block_size, device=device)
    for first in range(0, blocks.shape[0], step):
        part = blocks[first : first + step].to(device)
        rows = out[first : first + part.shape[0]]
        if scratch is None:
            _DEQUANT[kind.name](part, rows)  # straight into the result
        else:
            _DEQUANT[kind.name](part, scratch[: part.shape[0]])
            rows.copy_(scratch[: part.shape[0]])
    return out.view(-1)
