"""Q4_K, Q5_K and Q6_K encoders following ggml's reference quantizers (``quantize_row_q{4,5,6}_K_ref``,
what llama.cpp's quantizer uses without an importance matrix), in numpy over whole tensors.

Super-blocks of 256 values (layouts: ``dequant.py`` / ``gguf/__init__``):

* Q4_K / Q5_K: 8 sub-blocks of 32, each fitted as ``scale * q - min`` (q 0..15 / 0..31) by a weighted
  least-squares search over candidate scales (``_fit_affine``; weights ``rms(sub-block) + |x|``; 21
  candidates for Q4_K, 16 for Q5_K), then the 8 scales and 8 mins quantized to 6 bits against the
  super-block's largest (stored as float16 ``d``, ``dmin``) and the values re-quantized with them;
* Q6_K: 16 sub-blocks of 16, each fitted as ``scale * q`` (q -32..31) by a search over 19 candidate scales
  weighted by ``x^2`` (``_fit_symmetric``), the 16 scales stored as int8 against the largest (``d``).

As in ggml, every sum runs in float32 in element order, rounding is to the nearest integer with ties to
even, and a sub-block whose quantized scale is 0 keeps the codes of its fit. tests/asr/test_convert.py
checks the bytes against ggml's and tests/asr/test_kquants.py against the straightforward implementation
(tests/asr/kquants_reference.py) on awkward inputs.

Speed (a plain per-block loop took about 5 minutes for the 0.6B's decoder): the fits hold a piece of sub-blocks
transposed, ``[values per sub-block, sub-blocks]``, so each step is one numpy call over every sub-block of
the piece, and a sum in element order is one ``np.add.reduce`` over the first axis (numpy adds the rows
one after another, as ggml's loop does). ``quantize.encode`` hands over pieces of 2^18 values, on a
thread per core. A candidate's codes are not kept: the winner's inverse scale and offset are, and its
codes are recomputed once at the end. With numba installed the Q4_K/Q5_K fit runs compiled instead
(``kquants_fast.py``, ``affine_fit``). Timing: benchmarks/bench_convert.py.
"""

from __future__ import annotations

import logging

import numpy as np

F32 = np.float32
_EPS = F32(1e-15)  # ggml's GROUP_MAX_EPS


def _rint(v: np.ndarray) -> np.ndarray:
    return np.rint(v).astype(np.int32)


def _sum_from_first(t: np.ndarray) -> np.ndarray:
    """``t[0] + t[1] + ...`` over the rows, in that order (ggml starts these sums from the first term).
    ``np.add.reduce`` starts from +0, which differs only in a sum of zeros that are all -0."""
    acc = np.add.reduce(t, axis=0)
    zero = acc == 0
    if zero.any():
        acc[zero] = np.where(np.signbit(t[:, zero]).all(axis=0), F32(-0.0), F32(0.0))
    return acc


def _fit_affine(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Per column of ``x`` [n, M] (weights ``w``): (scale, -min, inverse scale, offset)
    minimising sum w (scale * q + min - x)^2 over the candidate inverse scales
    (nmax + rmin + rdelta * i) / (max - min), i = 0..nstep, each relative to the best min so far (as in
    ggml's make_qkx2_quants); min <= 0. The codes are ``_codes_into(.., inverse scale, offset, ..)``, 0 in a
    column whose scale is 0.

    A column whose values are all equal and <= 0 (max == min) is fitted as scale 0: its top is moved up by
    1, so its candidates' codes are all 0, their determinant 0, and none wins. The winners' values are
    blended into the state by bit masks (``_take``), numpy's masked copies being slow."""
    levels = np.empty_like(x)
    low_x = x.min(axis=0)
    low = np.minimum(low_x, F32(0))
    high = x.max(axis=0)
    flat = high == low
    high[flat] = low[flat] + F32(1)
    sum_w = _sum_from_first(w)
    sum_x = _sum_from_first(w * x)
    products = np.empty((3, *x.shape), dtype=F32)
    t = products[0]
    # state rows: the winner's inverse scale and the min its codes were taken against, its error, scale, min
    state = np.empty((5, x.shape[1]), dtype=F32)
    candidate, scratch = np.empty_like(state), np.empty(state.shape, dtype=np.int32)
    best_iscale, best_shift, best, scale, low_now = state
    span = high - low
    np.divide(F32(nmax), span, out=best_iscale)
    np.divide(F32(1), best_iscale, out=scale)
    best_shift[:] = low
    low_now[:] = low
    _codes_into(levels, x, best_iscale, low, nmax, clip=False)
    np.multiply(levels, scale, out=t)
    t += low
    t -= x
    np.square(t, out=t)
    t *= w
    np.add.reduce(t, axis=0, out=best)
    iscale, shift, error, this_scale, this_min = candidate
    moved_up = False  # whether a column's min has moved above its smallest value (codes below 0 from then)
    for step in range(nstep + 1):
        top = F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)
        np.subtract(high, low_now, out=span)
        np.divide(top, span, out=iscale)
        shift[:] = low_now
        moved_up = moved_up or bool(np.greater(low_now, low_x).any())
        # codes reach nmax + 1 only from a top above nmax + 0.5
        _codes_into(levels, x, iscale, low_now, nmax, clip=moved_up or top > nmax + 0.45)
        np.multiply(w, levels, out=products[0])
        np.multiply(products[0], levels, out=products[1])  # w*l*l and w*l*x, rounded after each product
        np.multiply(products[0], x, out=products[2])
        sum_l, sum_l2, sum_xl = np.add.reduce(products, axis=1)
        det = sum_w * sum_l2
        det -= sum_l * sum_l
        np.subtract(sum_w * sum_xl, sum_x * sum_l, out=this_scale)
        this_scale /= det  # garbage where det <= 0: those never win
        np.subtract(sum_l2 * sum_x, sum_l * sum_xl, out=this_min)
        this_min /= det
        if np.greater(this_min, 0).any():  # (not .max(): nan where det is 0)
            positive = this_min > 0
            this_min[positive] = 0
            this_scale[positive] = sum_xl[positive] / np.where(sum_l2 == 0, F32(1), sum_l2)[positive]
        np.multiply(levels, this_scale, out=t)
        t += this_min
        t -= x
        np.square(t, out=t)
        t *= w
        np.add.reduce(t, axis=0, out=error)
        better = error < best
        better &= det > 0
        _take(state, candidate, better, scratch)
    scale[flat] = 0
    best_iscale[flat] = 0  # codes 0
    return scale, -low_now, best_iscale, best_shift


_FIT = None  # the fit in use, chosen on first use by affine_fit()


def affine_fit():
    """The Q4_K/Q5_K fit: ``kquants_fast.fit_affine`` (the same arithmetic compiled with numba, about 3.7x
    faster, the same bytes) when numba imports, else ``_fit_affine``; docs/engine.md, "GGUF export"."""
    global _FIT
    if _FIT is None:
        try:
            from dictation.asr.checkpoints.gguf.kquants_fast import fit_affine
        except ImportError:
            fit_affine = _fit_affine
            logging.getLogger(__name__).warning(
                "numba is not installed: the Q4_K/Q5_K scale search runs in numpy, about 3.7x slower "
                "(pip install 'dictation[gguf]' for the compiled one; the file is the same)"
            )
        _FIT = fit_affine
    return _FIT


def _take(state: np.ndarray, candidate: np.ndarray, where: np.ndarray, scratch: np.ndarray) -> None:
    """``state[:, where] = candidate[:, where]`` for float32 rows, by bits: a mask of all ones where taken
    (numpy's masked copies are several times slower). ``scratch``: int32 like ``state``."""
    mask = where.astype(np.int32)
    np.negative(mask, out=mask)
    bits = state.view(np.int32)
    np.bitwise_xor(bits, candidate.view(np.int32), out=scratch)
    np.bitwise_and(scratch, mask, out=scratch)
    np.bitwise_xor(bits, scratch, out=bits)


def _codes_into(out: np.ndarray, x: np.ndarray, iscale: np.ndarray, shift: np.ndarray, nmax: int, *, clip: bool):
    """``clip(rint(iscale * (x - shift)), 0, nmax)`` per column of ``x`` [n, M], into ``out`` (float32);
    ``clip=False`` where the caller knows every code is in range already.

    A column whose inverse scale overflowed (a span below ~1e-37) gets codes 0, what ggml's nearest_int
    makes of inf and nan. Where it is finite, a code can only overflow downwards (x - shift <= the span),
    and the clip gives 0 there as ggml's does."""
    np.subtract(x, shift, out=out)
    out *= iscale
    np.rint(out, out=out)
    if clip:
        np.clip(out, F32(0), F32(nmax), out=out)
    if np.isinf(iscale.max()):
        out[:, ~np.isfinite(iscale)] = 0


def _requantized(values: np.ndarray, step: np.ndarray, low: int, high: int) -> np.ndarray:
    """``clip(rint(values / step), low, high)`` (float32); a quotient that is not a number or beyond
    int32 (from infinite scales: values near float32's limits) gives ``low``, as the straightforward
    encoder's integer conversion does."""
    out = values / step
    np.rint(out, out=out)
    if not (out.min() > -(2.0**31) and out.max() < 2.0**31):  # (false with a nan too)
        out[~(np.abs(out) < F32(2**31))] = low
    return np.clip(out, F32(low), F32(high), out=out)


def _fit_symmetric(x: np.ndarray, nmax: int):
    """Per column of ``x`` [n, M]: (scale, codes + nmax as float32) minimising sum x^2 (scale * q - x)^2,
    q in -nmax..nmax-1, over the inverse scales -(nmax + 0.1 i) / m, i = -9..9, where m is the value of
    largest magnitude (the first of them, as ggml's strict comparison keeps); ggml's make_qx_quants."""
    top = np.take_along_axis(x, np.abs(x).argmax(axis=0)[None], axis=0)[0]
    zero = np.abs(top) < _EPS
    safe_top = np.where(zero, F32(1), top)
    w = x * x
    wx = w * x
    levels, products = np.empty_like(x), np.empty((2, *x.shape), dtype=F32)

    def sums(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        np.multiply(x, iscale, out=levels)
        np.rint(levels, out=levels)
        np.clip(levels, F32(-nmax), F32(nmax - 1), out=levels)
        np.multiply(wx, levels, out=products[0])
        np.multiply(w, levels, out=products[1])
        products[1] *= levels
        sumlx, suml2 = np.add.reduce(products, axis=1)
        return sumlx, suml2

    best_iscale = F32(-nmax) / safe_top
    sumlx, suml2 = sums(best_iscale)
    scale = np.where(suml2 != 0, sumlx / np.where(suml2 == 0, F32(1), suml2), F32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / safe_top
        sumlx, suml2 = sums(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        np.copyto(best_iscale, iscale, where=better)
        np.copyto(scale, sumlx / np.where(better, suml2, F32(1)), where=better)
        np.copyto(best, scale * sumlx, where=better)
    np.multiply(x, best_iscale, out=levels)
    np.rint(levels, out=levels)
    np.clip(levels, F32(-nmax), F32(nmax - 1), out=levels)
    levels += F32(nmax)
    levels[:, zero] = 0
    scale[zero] = 0
    return scale, levels


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


def _transposed(blocks: np.ndarray, n: int) -> np.ndarray:
    """Super-blocks [B, 256] -> their sub-blocks of ``n`` as columns, ``[n, B * 256 / n]``, contiguous."""
    return np.ascontiguousarray(blocks.reshape(-1, n).T)


def _affine_k(blocks: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The shared part of Q4_K and Q5_K: (d, dmin as float16, 12 scale bytes, codes [B, 256])."""
    n_blocks = blocks.shape[0]
    x = _transposed(blocks, 32)
    av = np.sqrt(np.add.reduce(x * x, axis=0) / F32(32))
    weights = np.abs(x)
    weights += av
    scales, mins, iscale, shift = affine_fit()(x, weights, nmax, rmin, 0.1, nstep)
    scales, mins = scales.reshape(n_blocks, 8), mins.reshape(n_blocks, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    ls, lm = _six_bit(scales, max_scale), _six_bit(mins, max_min)
    d, dmin = _half(max_scale / F32(63)), _half(max_min / F32(63))
    step = (d.astype(F32)[:, None] * ls.astype(F32)).reshape(-1)
    offset = (dmin.astype(F32)[:, None] * lm.astype(F32)).reshape(-1)
    live = step != 0
    codes = _requantized(x + offset, np.where(live, step, F32(1)), 0, nmax)
    if not live.all():  # a sub-block whose 6-bit scale is 0 keeps the codes of its fit
        fitted = np.empty_like(x)
        _codes_into(fitted, x, iscale, shift, nmax, clip=True)
        codes = np.where(live, codes, fitted)
    return d, dmin, _pack_scales(ls, lm), np.ascontiguousarray(codes.T.astype(np.uint8)).reshape(n_blocks, 256)


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
    x = _transposed(blocks, 16)
    scales, codes = _fit_symmetric(x, 32)
    scales = scales.reshape(n_blocks, 16)
    pick = np.abs(scales).argmax(axis=1)  # the first of the largest, as ggml's strict comparison keeps
    max_scale = scales[np.arange(n_blocks), pick]
    zero = np.abs(max_scale) < _EPS
    iscale = F32(-128) / np.where(zero, F32(1), max_scale)
    d = _half(F32(1) / iscale)
    sc = np.minimum(127, _rint(iscale[:, None] * scales)).astype(np.int8)
    step = (d.astype(F32)[:, None] * sc.astype(F32)).reshape(-1)
    live = step != 0
    requant = _requantized(x, np.where(live, step, F32(1)), -32, 31)
    requant += F32(32)
    codes = np.where(live, requant, codes).astype(np.uint8)
    codes = np.ascontiguousarray(codes.T).reshape(n_blocks, 2, 4, 32)
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


ENCODERS = {"Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}  # each over a piece of whole super-blocks [B, 256]
