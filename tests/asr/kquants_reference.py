"""The straightforward Q4_K, Q5_K and Q6_K encoders, kept as the oracle for ``gguf/kquants.py``
(tests/asr/test_kquants.py): the converter's implementation until the whole-tensor one replaced it, slow
(one sub-block per row of a ``[sub-blocks, values]`` array, every sum a Python loop over the values) and
plain to read against ggml's ``quantize_row_q{4,5,6}_K_ref`` / ``make_qkx2_quants`` / ``make_qx_quants``
in ggml-quants.c. Its bytes equal ggml's (built without FMA contraction) on the inputs of
tests/asr/test_convert.py. The same steps as the fast one:

* Q4_K / Q5_K: 8 sub-blocks of 32, each fitted as ``scale * q - min`` (q 0..15 / 0..31) by a weighted
  least-squares search over candidate scales (``_fit_affine``; weights ``rms(sub-block) + |x|``; 21
  candidates for Q4_K, 16 for Q5_K), then the 8 scales and 8 mins quantized to 6 bits against the
  super-block's largest (stored as float16 ``d``, ``dmin``) and the values re-quantized with them;
* Q6_K: 16 sub-blocks of 16, each fitted as ``scale * q`` (q -32..31) by a search over 19 candidate scales
  weighted by ``x^2`` (``_fit_symmetric``), the 16 scales stored as int8 against the largest (``d``).

Every sum runs in float32 in element order, rounding is to the nearest integer with ties to even, and a
sub-block whose quantized scale is 0 keeps the codes of its fit.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
_EPS = F32(1e-15)  # ggml's GROUP_MAX_EPS


def _rint(v: np.ndarray) -> np.ndarray:
    return np.rint(v).astype(np.int32)


def _fit_affine(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Per row of ``x`` [M, n]: (scale, -min, codes) minimising sum w (scale * q + min - x)^2 over the
    candidate inverse scales (nmax + rmin + rdelta * i) / (max - min), i = 0..nstep; min <= 0."""
    n = x.shape[1]
    low, high = x[:, 0].copy(), x[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = sum_w * x[:, 0]
    for i in range(1, n):
        low = np.minimum(low, x[:, i])
        high = np.maximum(high, x[:, i])
        sum_w += w[:, i]
        sum_x += w[:, i] * x[:, i]
    low = np.minimum(low, F32(0))
    flat = high == low
    span = np.where(flat, F32(1), high - low)
    iscale = F32(nmax) / span
    scale = F32(1) / iscale
    shifted = x - low[:, None]
    codes = np.clip(_rint(iscale[:, None] * shifted), 0, nmax)
    best = np.zeros_like(sum_w)
    for i in range(n):
        diff = scale * codes[:, i].astype(F32) + low - x[:, i]
        best += w[:, i] * (diff * diff)
    for step in range(nstep + 1):  # as in ggml, each candidate is relative to the best min so far
        span = np.where(flat, F32(1), high - low)
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / span
        aux = np.clip(_rint(iscale[:, None] * (x - low[:, None])), 0, nmax)
        levels = aux.astype(F32)
        sum_l, sum_l2, sum_xl = (np.zeros_like(sum_w) for _ in range(3))
        for i in range(n):
            wl = w[:, i] * levels[:, i]
            sum_l += wl
            sum_l2 += wl * levels[:, i]
            sum_xl += wl * x[:, i]
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        safe = np.where(ok, det, F32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / safe
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe
        positive = this_min > 0
        this_min = np.where(positive, F32(0), this_min)
        this_scale = np.where(positive, sum_xl / np.where(sum_l2 == 0, F32(1), sum_l2), this_scale)
        error = np.zeros_like(sum_w)
        for i in range(n):
            diff = this_scale * levels[:, i] + this_min - x[:, i]
            error += w[:, i] * (diff * diff)
        better = ok & (error < best) & ~flat
        codes = np.where(better[:, None], aux, codes)
        best = np.where(better, error, best)
        scale = np.where(better, this_scale, scale)
        low = np.where(better, this_min, low)
    scale = np.where(flat, F32(0), scale)
    codes = np.where(flat[:, None], 0, codes)
    return scale.astype(F32), (-low).astype(F32), codes


def _fit_symmetric(x: np.ndarray, nmax: int):
    """Per row of ``x`` [M, n]: (scale, codes + nmax) minimising sum x^2 (scale * q - x)^2, q in -nmax..nmax-1,
    over the inverse scales -(nmax + 0.1 i) / m, i = -9..9, where m is the value of largest magnitude."""
    n = x.shape[1]
    top = np.zeros(x.shape[0], dtype=F32)
    amax = np.zeros(x.shape[0], dtype=F32)
    for i in range(n):
        ax = np.abs(x[:, i])
        bigger = ax > amax
        amax = np.where(bigger, ax, amax)
        top = np.where(bigger, x[:, i], top)
    zero = amax < _EPS
    safe_top = np.where(zero, F32(1), top)
    weights = x * x

    def sums(iscale):
        levels = np.clip(_rint(iscale[:, None] * x), -nmax, nmax - 1)
        lf = levels.astype(F32)
        sumlx = np.zeros_like(amax)
        suml2 = np.zeros_like(amax)
        for i in range(n):
            sumlx += weights[:, i] * x[:, i] * lf[:, i]
            suml2 += weights[:, i] * lf[:, i] * lf[:, i]
        return levels, sumlx, suml2

    codes, sumlx, suml2 = sums(F32(-nmax) / safe_top)
    scale = np.where(suml2 != 0, sumlx / np.where(suml2 == 0, F32(1), suml2), F32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        levels, sumlx, suml2 = sums(-(F32(nmax) + F32(0.1) * F32(step)) / safe_top)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        codes = np.where(better[:, None], levels, codes)
        scale = np.where(better, sumlx / np.where(suml2 > 0, suml2, F32(1)), scale)
        best = np.where(better, scale * sumlx, best)
    scale = np.where(zero, F32(0), scale)
    codes = np.where(zero[:, None], 0, codes + nmax)
    return scale.astype(F32), codes


def _half(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16)


def _six_bit(values: np.ndarray, largest: np.ndarray) -> np.ndarray:
    inv = np.where(largest > 0, F32(63) / np.where(largest > 0, largest, F32(1)), F32(0))
    return np.minimum(63, _rint(inv[:, None] * values)).astype(np.uint8)


def _pack_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> the 12 bytes ``get_scale_min_k4`` reads."""
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4]
    out[:, 4:8] = lm[:, 0:4]
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    out[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    out[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    return out


def _affine_k(blocks: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The shared part of Q4_K and Q5_K: (d, dmin as float16, 12 scale bytes, codes [B, 256])."""
    n_blocks = blocks.shape[0]
    sub = blocks.reshape(-1, 32)
    sum_x2 = np.zeros(sub.shape[0], dtype=F32)
    for i in range(32):
        sum_x2 += sub[:, i] * sub[:, i]
    av = np.sqrt(sum_x2 / F32(32))
    weights = av[:, None] + np.abs(sub)
    scales, mins, codes = _fit_affine(sub, weights, nmax, rmin, 0.1, nstep)
    scales, mins = scales.reshape(n_blocks, 8), mins.reshape(n_blocks, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    ls, lm = _six_bit(scales, max_scale), _six_bit(mins, max_min)
    d, dmin = _half(max_scale / F32(63)), _half(max_min / F32(63))
    step = d.astype(F32)[:, None] * ls.astype(F32)
    offset = dmin.astype(F32)[:, None] * lm.astype(F32)
    x = blocks.reshape(n_blocks, 8, 32)
    live = step != 0
    requant = np.clip(_rint((x + offset[..., None]) / np.where(live, step, F32(1))[..., None]), 0, nmax)
    codes = np.where(live[..., None], requant, codes.reshape(n_blocks, 8, 32)).reshape(n_blocks, 256)
    return d, dmin, _pack_scales(ls, lm), codes.astype(np.uint8)


def _bytes(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(p.shape[0], -1) for p in parts], axis=1)


def q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, codes = _affine_k(blocks, 15, -1.0, 20)
    halves = codes.reshape(-1, 4, 2, 32)
    qs = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(-1, 128)
    return _bytes(d[:, None], dmin[:, None], scales, qs)


def q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, codes = _affine_k(blocks, 31, -0.5, 15)
    halves = codes.reshape(-1, 4, 2, 32)
    qs = ((halves[:, :, 0] & 0xF) | ((halves[:, :, 1] & 0xF) << 4)).reshape(-1, 128)
    qh = np.zeros((codes.shape[0], 32), dtype=np.uint8)
    for group in range(4):
        qh |= (halves[:, group, 0] >> 4) << (2 * group)
        qh |= (halves[:, group, 1] >> 4) << (2 * group + 1)
    return _bytes(d[:, None], dmin[:, None], scales, qh, qs)


def q6_k(blocks: np.ndarray) -> np.ndarray:
    n_blocks = blocks.shape[0]
    sub = blocks.reshape(-1, 16)
    scales, codes = _fit_symmetric(sub, 32)
    scales = scales.reshape(n_blocks, 16)
    pick = np.abs(scales).argmax(axis=1)  # the first of the largest, as ggml's strict comparison keeps
    max_scale = scales[np.arange(n_blocks), pick]
    zero = np.abs(max_scale) < _EPS
    iscale = F32(-128) / np.where(zero, F32(1), max_scale)
    d = _half(F32(1) / iscale)
    sc = np.minimum(127, _rint(iscale[:, None] * scales)).astype(np.int8)
    step = d.astype(F32)[:, None] * sc.astype(F32)
    x = blocks.reshape(n_blocks, 16, 16)
    live = step != 0
    requant = np.clip(_rint(x / np.where(live, step, F32(1))[..., None]), -32, 31) + 32
    codes = np.where(live[..., None], requant, codes.reshape(n_blocks, 16, 16)).reshape(n_blocks, 2, 4, 32)
    codes = codes.astype(np.uint8)
    ql = np.concatenate(
        [codes[:, :, 0] & 0xF | ((codes[:, :, 2] & 0xF) << 4), codes[:, :, 1] & 0xF | ((codes[:, :, 3] & 0xF) << 4)],
        axis=2,
    ).reshape(n_blocks, 128)
    qh = (
        (codes[:, :, 0] >> 4)
        | ((codes[:, :, 1] >> 4) << 2)
        | ((codes[:, :, 2] >> 4) << 4)
        | ((codes[:, :, 3] >> 4) << 6)
    )
    out = _bytes(ql, qh.reshape(n_blocks, 64), sc, d[:, None])
    out[zero] = 0
    return out


ENCODERS = {"Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}
