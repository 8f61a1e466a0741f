"""The whole-tensor K-quant encoders (``gguf/kquants.py``) give byte for byte what the straightforward
implementation they replaced gives (``kquants_reference.py``: one sub-block per row, its sums a loop over
the values); that one is checked against ggml's own bytes in test_convert.py. Awkward inputs: all-zero,
constant, sign-mixed zeros, subnormal and huge values, ties for the rounding, outliers, one-sided blocks,
bf16-rounded weights, and tensors cut into many pieces (run on several threads)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from dictation.asr.checkpoints.gguf import kquants, quantize
from dictation.asr.checkpoints.gguf.quantize import encode
from tests.asr import kquants_reference

KINDS = ["Q4_K", "Q5_K", "Q6_K"]
# the reference overflows on the values near float32's limits (as ggml does) and says so
pytestmark = pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")


def awkward_blocks(seed: int, n_blocks: int) -> np.ndarray:
    """``n_blocks`` super-blocks of 256: the first ones each an awkward case, the rest bf16-rounded weights."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_blocks, 256)).astype(np.float32) * 0.02
    cases = [
        np.zeros(256),
        np.full(256, 0.25),
        np.full(256, -0.75),  # constant and negative: max == min in every sub-block
        np.where(np.arange(256) % 2 == 0, -0.0, 0.0),
        np.where(np.arange(256) % 3 == 0, -0.0, -rng.random(256)),
        rng.standard_normal(256) * 1e-38,  # subnormal
        rng.standard_normal(256) * 1e30,
        np.round(rng.standard_normal(256) * 8),  # integers: the candidate scales hit exact halves
        np.round(rng.standard_normal(256) * 8) / 16,
        np.abs(rng.standard_normal(256)),
        -np.abs(rng.standard_normal(256)),
        np.concatenate([np.zeros(255), [3.0]]),
        np.concatenate([[-5.0], rng.standard_normal(255) * 0.01]),
        np.tile(np.linspace(-1, 1, 32), 8),
        np.tile([1.0, -1.0], 128),
        rng.standard_t(2, 256) * 0.02,
        np.repeat(rng.standard_normal(16), 16),  # constant sub-blocks of Q6_K's 16, not of Q4_K's 32
        np.concatenate([np.zeros(128), rng.standard_normal(128)]),
    ]
    for i, case in enumerate(cases[:n_blocks]):
        x[i] = case
    rest = slice(len(cases), None)
    x[rest] = torch.from_numpy(x[rest]).bfloat16().float().numpy()  # what a bf16 checkpoint gives
    return x


def test_the_compiled_fit_is_used_when_numba_imports(monkeypatch):
    from dictation.asr.checkpoints.gguf import kquants_fast

    calls = []

    def spy(*args):
        calls.append(args[0].shape)
        return fast(*args)

    fast = kquants_fast.fit_affine
    monkeypatch.setattr(kquants_fast, "fit_affine", spy)
    monkeypatch.setattr(kquants, "_FIT", None)
    kquants.q4_k(awkward_blocks(3, 20))
    assert calls == [(32, 20 * 8)]


def test_the_numpy_fit_is_used_without_numba(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    monkeypatch.delitem(sys.modules, "dictation.asr.checkpoints.gguf.kquants_fast", raising=False)
    monkeypatch.setattr(kquants, "_FIT", None)
    with caplog.at_level("WARNING", logger=kquants.__name__):
        assert kquants.affine_fit() is kquants._fit_affine
        kquants.affine_fit()
    # said once, with what to install
    assert [r.getMessage().count("dictation[gguf]") for r in caplog.records] == [1]
    blocks = awkward_blocks(4, 20)
    assert np.array_equal(kquants.q5_k(blocks), kquants_reference.ENCODERS["Q5_K"](blocks))


def test_the_compiled_kernel_is_cached_only_in_a_folder_it_may_write(monkeypatch, tmp_path):
    from dictation.asr.checkpoints.gguf import kquants_fast

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert kquants_fast.may_cache(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    writable = {str(tmp_path): True, str(tmp_path / "__pycache__"): False}
    monkeypatch.setattr(kquants_fast.os, "access", lambda path, mode: writable[str(path)])
    assert not kquants_fast.may_cache(tmp_path)  # read-only install: numba would fall back to the user's home
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    assert kquants_fast.may_cache(tmp_path)


@pytest.mark.usefixtures("fit_path")
@pytest.mark.parametrize("kind", KINDS)
def test_fast_encoders_equal_the_reference_on_awkward_blocks(kind):
    blocks = awkward_blocks(1, 160)
    fast = kquants.ENCODERS[kind](blocks)
    reference = kquants_reference.ENCODERS[kind](blocks)
    assert fast.shape == reference.shape
    differing = np.flatnonzero((fast != reference).any(axis=1))
    assert differing.size == 0, f"{kind}: super-blocks {differing.tolist()} differ"


@pytest.mark.usefixtures("fit_path")
@pytest.mark.parametrize("kind", [*KINDS, "Q8_0", "Q5_0"])
def test_many_pieces_on_threads_give_the_same_bytes(kind, monkeypatch):
    blocks = awkward_blocks(2, 61)
    whole = encode(torch.from_numpy(blocks), kind)
    if kind in KINDS:
        assert np.array_equal(whole, kquants_reference.ENCODERS[kind](blocks))
    monkeypatch.setattr(quantize, "_PIECE_VALUES", {"K": 7 * 256, "legacy": 7 * 256})  # 9 pieces, the last short
    monkeypatch.setattr(quantize, "_workers", lambda: 3)
    monkeypatch.setattr(quantize, "_pool", None)
    assert np.array_equal(encode(torch.from_numpy(blocks), kind), whole)


@pytest.mark.usefixtures("fit_path")
@pytest.mark.parametrize("shape", [(3, 5, 512), (1, 256), (7, 768)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_encode_gives_the_reference_bytes_for_any_leading_shape(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    tensor = (torch.randn(shape, generator=g) * 0.05).to(dtype)
    blocks = tensor.float().numpy().reshape(-1, 256)
    for kind in KINDS:
        rows = tensor.reshape(-1, shape[-1]).shape[0]
        want = kquants_reference.ENCODERS[kind](blocks).reshape(rows, -1)
        assert np.array_equal(encode(tensor, kind), want), kind
