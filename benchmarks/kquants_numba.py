"""Experiment: ggml's Q4_K/Q5_K scale search (``kquants._fit_affine``) as a numba kernel, to size what compiled
code would give the converter (benchmarks/results/convert-2026-12-02.md). Not used by ``dictation convert``:
numba is not a dependency (here it comes with librosa, the reference extra).

    python benchmarks/kquants_numba.py [--reps 3]

The kernel is the numpy fit's arithmetic (float32, every sum in element order, no fast-math, so no fused
multiply-adds), looping over a few hundred sub-blocks at a time so each step runs over them in one vectorised
loop. It swaps itself in for ``_fit_affine`` and prints CPU ns per value of ``q4_k`` / ``q5_k`` with each fit
(one thread, interleaved), and whether the bytes equal the numpy encoder's on a 1024 x 1024 bf16 matrix and
the straightforward encoder's (tests/asr/kquants_reference.py) on the awkward blocks of tests/asr/test_kquants.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

try:
    import numba as nb
except ImportError:  # pragma: no cover
    raise SystemExit("benchmarks/kquants_numba.py: needs numba (pip install numba)") from None


@nb.njit(cache=True, fastmath=False, nogil=True, error_model="numpy")
def fit_affine(x, w, nmax, rmin, rdelta, nstep):
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


def main(argv: list[str] | None = None) -> int:
    import torch

    from dictation.asr.checkpoints.gguf import kquants
    from tests.asr import kquants_reference
    from tests.asr.test_kquants import awkward_blocks

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    np.seterr(all="ignore")
    numpy_fit = kquants._fit_affine

    def compiled_fit(x, w, nmax, rmin, rdelta, nstep):
        return fit_affine(x, w, nmax, np.float32(rmin), np.float32(rdelta), nstep)

    start = time.process_time()
    kquants._fit_affine = compiled_fit
    awkward = awkward_blocks(1, 160)
    same_awkward = {
        k: np.array_equal(kquants.ENCODERS[k](awkward), kquants_reference.ENCODERS[k](awkward))
        for k in ("Q4_K", "Q5_K")
    }
    print(f"compile + first call: {time.process_time() - start:.1f} CPU s; awkward blocks = reference: {same_awkward}")
    g = torch.Generator().manual_seed(0)
    blocks = (torch.randn(1024, 1024, generator=g) * 0.02).bfloat16().float().numpy().reshape(-1, 256)
    piece = 1024  # super-blocks per call: the converter's 2^18 values
    for kind in ("Q4_K", "Q5_K"):
        times: dict[str, list[float]] = {"numpy": [], "numba": []}
        out = {}
        for _ in range(args.reps):
            for label, fit in (("numpy", numpy_fit), ("numba", compiled_fit)):
                kquants._fit_affine = fit
                start = time.process_time()
                out[label] = np.concatenate(
                    [kquants.ENCODERS[kind](blocks[i : i + piece]) for i in range(0, len(blocks), piece)]
                )
                times[label].append((time.process_time() - start) / blocks.size * 1e9)
        kquants._fit_affine = numpy_fit
        same = np.array_equal(out["numpy"], out["numba"])
        cells = ", ".join(f"{k} {min(v):.0f}" for k, v in times.items())
        print(f"{kind}: CPU ns per value (best of {args.reps}) {cells}; same bytes: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
