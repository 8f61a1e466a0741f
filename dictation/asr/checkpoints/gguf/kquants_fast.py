"""``kquants._fit_affine`` (ggml's Q4_K/Q5_K scale search) compiled with numba, used by the encoder when
numba imports (it is optional: ``pip install 'dictation[gguf]'``); docs/engine.md, "GGUF export".

The same arithmetic as the numpy fit, so the same bytes: float32, every sum in element order, no fast-math
(no fused multiply-adds), ties to even. It loops over ``CH`` sub-blocks at a time so each step is one loop over
them that LLVM vectorises. Measured at 42 CPU ns per value against the numpy fit's 156
(benchmarks/kquants_numba.py, benchmarks/results/convert-2026-12-02.md).

Compiled code is cached (``cache=True``) in ``__pycache__`` beside this file only when that folder can be
written or ``NUMBA_CACHE_DIR`` names a place: otherwise numba would fall back to a folder in the user's
home, so the kernel is compiled in each process instead (a few seconds, once per conversion).
"""

from __future__ import annotations

import os
from pathlib import Path

import numba as nb
import numpy as np


def may_cache(folder: Path) -> bool:
    """Whether numba may keep the compiled kernel: in ``folder/__pycache__`` if it can be written (or made), or
    where ``NUMBA_CACHE_DIR`` says. Never in numba's own fallback, a folder in the user's home."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return True
    pycache = folder / "__pycache__"
    return os.access(pycache, os.W_OK) if pycache.exists() else os.access(folder, os.W_OK)


_CACHE = may_cache(Path(__file__).resolve().parent)


@nb.njit(cache=_CACHE, fastmath=False, nogil=True, error_model="numpy")
def _kernel(x, w, nmax, rmin, rdelta, nstep):
    """``kquants._fit_affine``'s result (scale, -min, the winner's inverse scale and shift) per column of ``x``
    [n, M], in blocks of ``CH`` columns: each step a loop over the block's columns, vectorised by LLVM."""
    n, M = x.shape
    scale_out = np.empty(M, np.float32)
    min_out = np.empty(M, np.float32)
    iscale_out = np.empty(M, np.float32)
    shift_out = np.empty(M, np.float32)
    CH = 256
    L = np.empty((n, CH), np.float32)
    sw = np.empty(CH, np.float32)
    sx = np.empty(CH, np.float32)
    lo = np.empty(CH, np.float32)
    hi = np.empty(CH, np.float32)
    sl = np.empty(CH, np.float32)
    sl2 = np.empty(CH, np.float32)
    sxl = np.empty(CH, np.float32)
    err = np.empty(CH, np.float32)
    best = np.empty(CH, np.float32)
    isc = np.empty(CH, np.float32)
    mn = np.empty(CH, np.float32)
    sc = np.empty(CH, np.float32)
    ts = np.empty(CH, np.float32)
    tm = np.empty(CH, np.float32)
    D = np.empty(CH, np.float32)
    bis = np.empty(CH, np.float32)
    bsh = np.empty(CH, np.float32)
    flat = np.empty(CH, np.bool_)
    fn = np.float32(nmax)
    zero = np.float32(0)
    one = np.float32(1)
    for c0 in range(0, M, CH):
        m = min(CH, M - c0)
        x0 = x[0, c0 : c0 + m]
        w0 = w[0, c0 : c0 + m]
        for c in range(m):
            lo[c] = x0[c]
            hi[c] = x0[c]
            sw[c] = w0[c]
            sx[c] = w0[c] * x0[c]
        for i in range(1, n):
            xi = x[i, c0 : c0 + m]
            wi = w[i, c0 : c0 + m]
            for c in range(m):
                v = xi[c]
                lo[c] = v if v < lo[c] else lo[c]
                hi[c] = v if v > hi[c] else hi[c]
                sw[c] += wi[c]
                sx[c] += wi[c] * v
        for c in range(m):
            if lo[c] > zero:
                lo[c] = zero
            flat[c] = hi[c] == lo[c]
            isc[c] = fn / (hi[c] - lo[c]) if not flat[c] else zero
            sc[c] = one / isc[c] if not flat[c] else zero
            mn[c] = lo[c]
            best[c] = zero
            bis[c] = isc[c]
            bsh[c] = lo[c]
        for i in range(n):
            xi = x[i, c0 : c0 + m]
            wi = w[i, c0 : c0 + m]
            for c in range(m):
                l = np.rint(isc[c] * (xi[c] - mn[c]))
                l = zero if l < zero else l
                l = fn if l > fn else l
                diff = sc[c] * l + mn[c] - xi[c]
                best[c] += wi[c] * (diff * diff)
        for step in range(nstep + 1):
            top = np.float32(rmin) + np.float32(rdelta) * np.float32(step) + fn
            for c in range(m):
                isc[c] = top / (hi[c] - mn[c])
                sl[c] = zero
                sl2[c] = zero
                sxl[c] = zero
                err[c] = zero
            for i in range(n):
                xi = x[i, c0 : c0 + m]
                wi = w[i, c0 : c0 + m]
                Li = L[i, :m]
                for c in range(m):
                    l = np.rint(isc[c] * (xi[c] - mn[c]))
                    l = zero if l < zero else l
                    l = fn if l > fn else l
                    Li[c] = l
                    wl = wi[c] * l
                    sl[c] += wl
                    sl2[c] += wl * l
                    sxl[c] += wl * xi[c]
            for c in range(m):
                D[c] = sw[c] * sl2[c] - sl[c] * sl[c]
                ts[c] = (sw[c] * sxl[c] - sx[c] * sl[c]) / D[c]
                tm[c] = (sl2[c] * sx[c] - sl[c] * sxl[c]) / D[c]
                if tm[c] > zero:
                    tm[c] = zero
                    ts[c] = sxl[c] / sl2[c]
            for i in range(n):
                xi = x[i, c0 : c0 + m]
                wi = w[i, c0 : c0 + m]
                Li = L[i, :m]
                for c in range(m):
                    diff = ts[c] * Li[c] + tm[c] - xi[c]
                    err[c] += wi[c] * (diff * diff)
            for c in range(m):
                if D[c] > zero and err[c] < best[c] and not flat[c]:
                    best[c] = err[c]
                    sc[c] = ts[c]
                    bis[c] = isc[c]
                    bsh[c] = mn[c]
                    mn[c] = tm[c]
        for c in range(m):
            if flat[c]:
                sc[c] = zero
                bis[c] = zero
            scale_out[c0 + c] = sc[c]
            min_out[c0 + c] = -mn[c]
            iscale_out[c0 + c] = bis[c]
            shift_out[c0 + c] = bsh[c]
    return scale_out, min_out, iscale_out, shift_out


def fit_affine(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """``kquants._fit_affine``'s signature and result, from the compiled kernel."""
    return _kernel(x, w, nmax, np.float32(rmin), np.float32(rdelta), nstep)
