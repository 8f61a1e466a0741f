"""Fixtures shared by the GGUF encoder tests (test_kquants.py, test_convert.py)."""

from __future__ import annotations

import pytest

from dictation.asr.checkpoints.gguf import kquants


@pytest.fixture(params=["numpy", "numba"])
def fit_path(request, monkeypatch):
    """Runs a test with each Q4_K/Q5_K fit: the numpy one and the numba kernel (numba is in the test extra)."""
    if request.param == "numba":
        from dictation.asr.checkpoints.gguf import kquants_fast

        fit = kquants_fast.fit_affine
    else:
        fit = kquants._fit_affine
    monkeypatch.setattr(kquants, "_FIT", fit)
    return request.param
