"""Encoding float tensors as GGUF tensor types (the inverse of ``dequant.py``), in numpy, one tensor at a time.

The legacy block types follow ggml's reference quantizers (``quantize_row_*_ref`` in ggml-quants.c), which
gguf-py reproduces bit for bit; ours give the same bytes (tests/asr/test_convert.py checks it against
``gguf.quants.quantize``). All arithmetic is float32, as theirs is. Per block of 32 values:

* Q8_0: ``d = max|x| / 127``, ``q = round(x / d)`` (halves away from zero);
* Q4_0 / Q5_0: ``d = m / -8`` (``-16``) where ``m`` is the value of largest magnitude, sign kept, and
  ``q = trunc(x / d + 8.5)`` (``16.5``) clipped to 0..15 (0..31);
* Q4_1 / Q5_1: ``d = (max - min) / 15`` (``31``), ``q = trunc((x - min) / d + 0.5)`` clipped, ``min`` stored.

``1 / d`` is taken as 0 where ``d`` is 0. Scales are stored as float16. Q4_K, Q5_K and Q6_K: ``kquants.py``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from dictation.asr.checkpoints.gguf import kquants
from dictation.asr.checkpoints.gguf.reader import SUPPORTED_TYPES, TensorType

TYPE_IDS = {kind.name: type_id for type_id, kind in SUPPORTED_TYPES.items()}
WRITABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
# What llama.cpp's quantizer stores instead of a K-quant for rows that are not a multiple of 256.
K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
BITS = {"F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8, "Q6_K": 6, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5}
BITS |= {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4}


def kind(name: str) -> TensorType:
    return SUPPORTED_TYPES[TYPE_IDS[name]]


def fits(type_name: str, shape: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` can be stored as ``type_name`` (its rows a whole number of blocks)."""
    block = kind(type_name).block_size
    return bool(shape) and shape[-1] % block == 0


def encode(tensor: torch.Tensor, type_name: str) -> np.ndarray:
    """``tensor`` (any float dtype) as the bytes of ``type_name``: uint8, ``[rows, bytes per row]``."""
    rows = _rows(tensor)
    return np.concatenate([p.reshape(-1) for p in encode_chunks(rows, type_name)]).reshape(rows.shape[0], -1)


def encode_chunks(tensor: torch.Tensor, type_name: str, chunk_values: int = 1 << 22) -> Iterator[np.ndarray]:
    """``encode``'s bytes in order, in parts: the float types in slices of whole rows of about
    ``chunk_values`` values, the block types piece by piece as a thread per core finishes them (each piece
    widened to float32 by the thread that encodes it). The float32 temporaries of a large matrix (the
    embeddings: 311M values in the 1.7B model) never exist at full size."""
    rows = _rows(tensor)
    if type_name in FLOAT_ENCODERS:
        step = max(1, chunk_values // max(1, rows.shape[1]))
        for start in range(0, rows.shape[0], step):
            yield FLOAT_ENCODERS[type_name](rows[start : start + step])
        return
    encoder = _BLOCK_ENCODERS.get(type_name) or kquants.ENCODERS.get(type_name)
    if encoder is None:
        raise ValueError(f"cannot write {type_name}")
    blocks = rows.reshape(-1, kind(type_name).block_size)
    step = max(1, _PIECE_VALUES["K" if type_name in kquants.ENCODERS else "legacy"] // blocks.shape[1])
    yield from _in_pieces(encoder, blocks, step)


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    t = tensor.detach().cpu()
    return t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)


FLOAT_ENCODERS: dict[str, Callable[[torch.Tensor], np.ndarray]] = {
    "F32": lambda rows: rows.float().numpy().view(np.uint8),
    "F16": lambda rows: rows.half().numpy().view(np.uint8),
    "BF16": lambda rows: rows.bfloat16().view(torch.int16).numpy().view(np.uint8),
}
# Values per piece a thread encodes at a time: the K-quants' temporaries (6 arrays of float32) stay near a
# core's L2 cache, and numpy's per-call cost stays small beside the work; the block types' few
# temporaries are re-used by the allocator instead of faulted in anew for every chunk.
_PIECE_VALUES = {"K": 1 << 18, "legacy": 1 << 15}
_AHEAD = 4  # pieces queued per thread beyond the one it works on
_pool: ThreadPoolExecutor | None = None


def _workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cores))


def _float32(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as float32 in numpy; bf16 widened by its bits (exact, and in numpy: no torch
    threads started from the encoding threads)."""
    if t.dtype == torch.float32:
        return t.numpy()
    if t.dtype == torch.bfloat16:
        return (t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return t.numpy().astype(np.float32)


def _in_pieces(encoder: Callable[[np.ndarray], np.ndarray], blocks: torch.Tensor, step: int) -> Iterator[np.ndarray]:
    """``encoder`` over ``blocks`` [B, block values] in pieces of ``step`` blocks, in order, on a thread per
    core (numpy lets go of the GIL inside each call) with a few pieces queued ahead, under
    ``np.errstate(all="ignore")``: values near float32's limits overflow in the K-quants' fits, as they
    do in ggml, and give what ggml gives."""
    global _pool

    def encode_piece(piece: torch.Tensor) -> np.ndarray:
        with np.errstate(all="ignore"):
            return encoder(_float32(piece))

    pieces = (blocks[i : i + step] for i in range(0, max(1, blocks.shape[0]), step))
    if blocks.shape[0] <= step or _workers() == 1:
        yield from map(encode_piece, pieces)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="gguf-encode")
    queued: deque[Future[np.ndarray]] = deque()
    try:
        for piece in pieces:
            queued.append(_pool.submit(encode_piece, piece))
            if len(queued) > _workers() * (1 + _AHEAD):
                yield queued.popleft().result()
        while queued:
            yield queued.popleft().result()
    finally:
        for future in queued:
            future.cancel()


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _half(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """32 codes per block -> 16 bytes: codes 0-15 in the low nibbles, 16-31 in the high ones."""
    return (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))


def _high_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of 32 codes as a little-endian u32 (bit i = code i)."""
    return np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=-1, bitorder="little")


def _q8_0(x: np.ndarray) -> np.ndarray:
    d = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    v = x * _inverse(d)
    a = np.abs(v)
    whole = np.floor(a)
    q = np.sign(v) * (whole + np.floor(2 * (a - whole)))  # round half away from zero
    return np.concatenate([_half(d), q.astype(np.int8).view(np.uint8)], axis=1)


def _symmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    biggest = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
    d = (biggest / np.float32(-levels)).astype(np.float32)
    q = np.trunc(x * _inverse(d) + np.float32(levels + 0.5)).astype(np.float32)
    return d, q.astype(np.uint8).clip(0, 2 * levels - 1)


def _affine(x: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = ((high - low) / np.float32(top)).astype(np.float32)
    q = np.trunc((x - low) * _inverse(d) + np.float32(0.5)).astype(np.float32)
    return d, low, q.astype(np.uint8).clip(0, top)


def _q4_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 8)
    return np.concatenate([_half(d), _nibbles(q)], axis=1)


def _q5_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 16)
    return np.concatenate([_half(d), _high_bits(q), _nibbles(q)], axis=1)


def _q4_1(x: np.ndarray) -> np.ndarray:
    d, low, q = _affine(x, 15)
    return np.concatenate([_half(d), _half(low), _nibbles(q)], axis=1)


def _q5_1(x: np.ndarray) -> np.ndarray:
    d, low, q = _affine(x, 31)
    return np.concatenate([_half(d), _half(low), _high_bits(q), _nibbles(q)], axis=1)


_BLOCK_ENCODERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1}
