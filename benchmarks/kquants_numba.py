"""The numba Q4_K/Q5_K scale search (``gguf/kquants_fast.py``, which ``dictation convert`` uses when numba is
installed: the ``gguf`` extra) against the numpy one (``kquants._fit_affine``), with the same bytes
(benchmarks/results/convert-2026-12-02.md).

    python benchmarks/kquants_numba.py [--reps 3]

It sets each fit in turn as the encoder's (``kquants._FIT``) and prints CPU ns per value of ``q4_k`` /
``q5_k`` with each fit (one thread, interleaved), and whether the bytes equal the numpy encoder's on a 1024 x
1024 bf16 matrix and the straightforward encoder's (tests/asr/kquants_reference.py) on the awkward blocks of
tests/asr/test_kquants.py.
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


def main(argv: list[str] | None = None) -> int:
    import torch

    from dictation.asr.checkpoints.gguf import kquants
    from tests.asr import kquants_reference
    from tests.asr.test_kquants import awkward_blocks

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    np.seterr(all="ignore")
    try:
        from dictation.asr.checkpoints.gguf.kquants_fast import fit_affine as compiled_fit
    except ImportError:
        raise SystemExit("benchmarks/kquants_numba.py: needs numba (pip install 'dictation[gguf]')") from None
    numpy_fit = kquants._fit_affine

    start = time.process_time()
    kquants._FIT = compiled_fit
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
                kquants._FIT = fit
                start = time.process_time()
                out[label] = np.concatenate(
                    [kquants.ENCODERS[kind](blocks[i : i + piece]) for i in range(0, len(blocks), piece)]
                )
                times[label].append((time.process_time() - start) / blocks.size * 1e9)
        kquants._FIT = numpy_fit
        same = np.array_equal(out["numpy"], out["numba"])
        cells = ", ".join(f"{k} {min(v):.0f}" for k, v in times.items())
        print(f"{kind}: CPU ns per value (best of {args.reps}) {cells}; same bytes: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
