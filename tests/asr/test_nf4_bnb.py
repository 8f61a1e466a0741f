"""Our NF4 (dictation/asr/tune/nf4.py) against an independent implementation: bitsandbytes'
``quantize_4bit(quant_type="nf4")``, which runs on the CPU since bitsandbytes 0.46.

First level (64-value blocks, fp32 absmax): bitsandbytes and we must pick the very same 4-bit level
for every value and the very same block scale. Its packing differs (the first value of a pair in the
high nibble; ours in the low one), so levels are compared, not bytes.

Double quantization: both subtract the mean of the block scales and quantize the centred scales
in blocks of 256 to an index into the signed dynamic 8-bit code, with one fp32 scale per block.
The code books and second-level scales must be identical, and the indices too for all but a few
scales: bitsandbytes' search for the nearest code value is approximate near a midpoint between two
(off by one or two places for about 0.3 % of the scales here), ours exact, so where they differ
ours must be the nearer.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from dictation.asr.tune.nf4 import BLOCK, DYNAMIC_CODE, NF4_CODE, SCALE_BLOCK, bits_per_parameter, quantize_nf4


@pytest.fixture(scope="module")
def bnb():
    """bitsandbytes.functional (in the test extra), imported only where used: it takes seconds and
    brings Triton in."""
    import importlib

    with warnings.catch_warnings():  # (no GPU: it warns that only its CPU backend is there)
        warnings.simplefilter("ignore")
        return importlib.import_module("bitsandbytes.functional")


# the weights' names, for parametrize: the tensors are made when a test runs, not at collection
WEIGHTS = ("normal", "student-t", "ragged", "zero blocks", "bf16")


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(18)
    tensors = [
        torch.randn(512, 1024, generator=g) * 0.02,
        # student-t: heavy tails, as trained weights have: a few large values set their blocks' scales
        torch.distributions.StudentT(3.0).sample((256, 896)) * 0.01,
        torch.randn(33, 70, generator=g),  # ragged: 2310 values, the last block is partial
        torch.cat([torch.zeros(4, 64), torch.randn(4, 64, generator=g)]),
        (torch.randn(128, 384, generator=g) * 0.05).to(torch.bfloat16),
    ]
    return dict(zip(WEIGHTS, tensors, strict=True))


def _our_levels(codes: torch.Tensor, n: int) -> torch.Tensor:
    return torch.stack([codes & 0x0F, codes >> 4], dim=-1).view(-1)[:n].long()


def _bnb_levels(packed: torch.Tensor, n: int) -> torch.Tensor:
    packed = packed.view(-1)
    return torch.stack([packed >> 4, packed & 0x0F], dim=-1).view(-1)[:n].long()


@pytest.mark.parametrize("name", WEIGHTS)
def test_first_level_picks_the_same_level_and_scale_as_bitsandbytes(bnb, name):
    w = _weights()[name]
    packed, state = bnb.quantize_4bit(w, quant_type="nf4", blocksize=BLOCK, compress_statistics=False)
    ours = quantize_nf4(w, double_quant=False)
    assert torch.equal(state.code.float(), torch.tensor(NF4_CODE))  # the same code book
    assert torch.equal(ours.absmax, state.absmax.float())
    n = w.numel()
    # an all-zero block has no level to pick (0 / 0; any level times a zero scale is 0): bitsandbytes'
    # choice there varies from run to run, so levels are compared where the block's scale is not 0
    scaled = (ours.absmax > 0).repeat_interleave(BLOCK)[:n]
    assert torch.equal(_our_levels(ours.codes, n)[scaled], _bnb_levels(packed, n)[scaled])
    theirs = bnb.dequantize_4bit(packed, state)  # in the weight's dtype
    assert torch.equal(ours.dequantize(w.dtype), theirs)


@pytest.mark.parametrize("name", ["normal", "student-t", "ragged"])
def test_double_quantization_matches_bitsandbytes(bnb, name):
    w = _weights()[name].float()
    packed, state = bnb.quantize_4bit(w, quant_type="nf4", blocksize=BLOCK, compress_statistics=True)
    assert state.nested and state.state2.blocksize == SCALE_BLOCK  # bitsandbytes' double quantization
    ours = quantize_nf4(w, double_quant=True)
    assert torch.allclose(DYNAMIC_CODE, state.state2.code, rtol=0, atol=1e-7)
    assert torch.allclose(ours.mean, state.offset)  # the same centring
    assert torch.equal(ours.scale2, state.state2.absmax)
    n = state.absmax.numel()
    mine, theirs = ours.qscale[:n].long(), state.absmax.long()
    differ = mine != theirs
    # where they differ, ours is the nearer code value
    exact = quantize_nf4(w, double_quant=False).absmax - state.offset
    x = exact / ours.scale2.repeat_interleave(SCALE_BLOCK)[:n]
    err_mine, err_theirs = (x - DYNAMIC_CODE[mine]).abs(), (x - DYNAMIC_CODE[theirs]).abs()
    assert (err_mine[differ] <= err_theirs[differ] + 1e-7).all()
    assert differ.float().mean() < 0.01
    # the weights: the same but for those scales
    w_theirs = bnb.dequantize_4bit(packed, state).float()
    same_scale = ~differ.repeat_interleave(BLOCK)[: w.numel()].view(w.shape)
    assert torch.allclose(ours.dequantize()[same_scale], w_theirs[same_scale], rtol=1e-6, atol=1e-7)
    rms_theirs = (w_theirs - w).pow(2).mean().sqrt()
    rms_ours = (ours.dequantize() - w).pow(2).mean().sqrt()
    assert rms_ours <= rms_theirs * 1.0001


def test_storage_matches_bitsandbytes_per_parameter(bnb):
    """Bytes stored per weight: bitsandbytes' packed codes + uint8 scales + fp32 second-level scales
    against ours; both the paper's 4.127 bits (its 256-entry code book and offset left out)."""
    w = _weights()["normal"]
    packed, state = bnb.quantize_4bit(w, quant_type="nf4", blocksize=BLOCK, compress_statistics=True)
    theirs = packed.numel() + state.absmax.numel() * state.absmax.element_size() + state.state2.absmax.numel() * 4
    ours = quantize_nf4(w, double_quant=True)
    ours_bytes = ours.nbytes - ours.mean.numel() * 4
    assert ours_bytes == theirs
    assert ours_bytes * 8 / w.numel() == pytest.approx(bits_per_parameter(True))
