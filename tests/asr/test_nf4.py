"""NF4 with double quantization (tune/nf4.py) against the paper's code book and an independent numpy
reimplementation, its error bound, its size, and the gradient path of a frozen NF4 layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dictation.asr.tune.nf4 import (
    BLOCK,
    DYNAMIC_CODE,
    DYNAMIC_MAX_GAP,
    MAX_GAP,
    NF4_CODE,
    SCALE_BLOCK,
    NF4Linear,
    bits_per_parameter,
    nf4_decoder,
    quantize_nf4,
)


def paper_code() -> np.ndarray:
    """The NF4 levels rebuilt from the QLoRA paper's recipe (appendix E, bitsandbytes' create_normal_map
    with offset 0.9677): 8 positive quantiles of N(0, 1), 7 negative, and an exact zero, scaled by the max."""
    from scipy.stats import norm  # slow to import (3 s of the suite's collection)

    offset = 0.9677083
    positive = norm.ppf(np.linspace(offset, 0.5, 9)[:-1])
    negative = -norm.ppf(np.linspace(offset, 0.5, 8)[:-1])
    values = np.sort(np.concatenate([positive, [0.0], negative]))
    return values / np.abs(values).max()


def dynamic_code() -> np.ndarray:
    """The signed dynamic 8-bit code built as an 8-bit float: a sign bit, then for a value with e
    leading zero bits (e = 0..6 after the sign) the decade 10^-e, and the remaining 6 - e bits a
    linear fraction in [0.1, 1] taken at the middle of its bin; plus 0 and 1."""
    values = {0.0, 1.0}
    for zeros in range(7):
        bits = 6 - zeros  # fraction bits left
        for k in range(2**bits):
            fraction = 0.1 + 0.9 * (k + 0.5) / 2**bits
            values |= {fraction * 10.0**-zeros, -fraction * 10.0**-zeros}
    return np.array(sorted(values), dtype=np.float64)


def reference(weight: np.ndarray, double_quant: bool) -> np.ndarray:
    """Independent numpy NF4 round trip: nearest level by argmin; double quantization with the
    dynamic 8-bit code, nearest by argmin."""
    code = np.array(NF4_CODE, dtype=np.float64)
    flat = weight.astype(np.float64).reshape(-1)
    n = flat.size
    flat = np.concatenate([flat, np.zeros((-n) % BLOCK)])
    blocks = flat.reshape(-1, BLOCK)
    absmax = np.abs(blocks).max(axis=1)
    safe = np.where(absmax > 0, absmax, 1.0)
    idx = np.abs(blocks[:, :, None] / safe[:, None, None] - code[None, None, :]).argmin(axis=2)
    if double_quant:
        absmax = absmax.astype(np.float32)
        mean = absmax.mean(dtype=np.float64)
        c = absmax - mean
        c = np.concatenate([c, np.zeros((-c.size) % SCALE_BLOCK)]).reshape(-1, SCALE_BLOCK)
        scale2 = np.abs(c).max(axis=1)
        x = c / np.where(scale2 > 0, scale2, 1.0)[:, None]
        dyn = dynamic_code()
        q = dyn[np.abs(x[:, :, None] - dyn[None, None, :]).argmin(axis=2)]
        absmax = ((q * scale2[:, None]).reshape(-1) + mean)[: absmax.size]
    return (code[idx] * absmax[:, None]).reshape(-1)[:n].reshape(weight.shape)


def test_dynamic_code_is_the_8_bit_float_code():
    assert DYNAMIC_CODE.shape == (256,) and DYNAMIC_CODE.dtype == torch.float32
    np.testing.assert_allclose(DYNAMIC_CODE.numpy(), dynamic_code(), rtol=1e-6, atol=1e-12)
    assert DYNAMIC_CODE[-1] == 1.0 and (DYNAMIC_CODE == 0).sum() == 1 and DYNAMIC_MAX_GAP < 0.015


def test_code_book_is_the_papers():
    assert len(NF4_CODE) == 16 and NF4_CODE[7] == 0.0 and NF4_CODE[0] == -1.0 and NF4_CODE[-1] == 1.0
    np.testing.assert_allclose(NF4_CODE, paper_code(), atol=2e-6)
    assert abs(MAX_GAP - (1.0 - 0.6961928009986877)) < 1e-7


@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize("shape", [(96, 160), (7, 45), (300, 64)])
def test_matches_numpy_reference_and_error_bound(double_quant, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(shape, generator=gen) * torch.rand(shape[0], 1, generator=gen) * 3
    w[0, :5] = torch.tensor([10.0, -10.0, 0.0, 5.0, -0.01])  # an outlier block
    q = quantize_nf4(w, double_quant)
    got = q.dequantize()
    assert got.shape == w.shape and got.dtype == torch.float32
    ref = reference(w.numpy(), double_quant)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-6)
    # The bound: half the widest gap times the block's absmax, plus the scale's own error.
    flat = torch.nn.functional.pad(w.reshape(-1), (0, (-w.numel()) % BLOCK)).view(-1, BLOCK)
    absmax = flat.abs().amax(dim=1)
    scales = q.block_scales()[: absmax.numel()]
    scale_err = (scales - absmax).abs()
    if double_quant:
        assert q.scale2 is not None and (scale_err > 0).any()
        bound2 = q.scale2.repeat_interleave(SCALE_BLOCK)[: absmax.numel()] * DYNAMIC_MAX_GAP / 2
        assert (scale_err <= bound2 + 1e-6).all()
    else:
        assert (scale_err == 0).all()
    err = (got.reshape(-1) - w.reshape(-1)).abs()
    err = torch.nn.functional.pad(err, (0, flat.numel() - err.numel())).view(-1, BLOCK)
    bound = MAX_GAP / 2 * absmax + scale_err  # |c * s' - x| <= |c| |s' - s| + |c s - x|, |c| <= 1
    assert (err <= bound[:, None] + 1e-5).all()
    assert err.max() > 0.5 * (MAX_GAP / 2 * absmax).min()  # the bound is not vacuous: errors are of its size


def test_bits_per_parameter():
    assert bits_per_parameter(double_quant=False) == 4.5
    assert bits_per_parameter() == pytest.approx(4.127, abs=5e-4)
    # measured on a tensor of whole blocks: the formula plus the 4-byte mean
    w = torch.randn(256, 256)
    for dq in (True, False):
        q = quantize_nf4(w, dq)
        assert q.nbytes * 8 / w.numel() == pytest.approx(bits_per_parameter(dq) + (32 / w.numel() if dq else 0))


def test_frozen_layer_passes_gradient_to_input_only():
    torch.manual_seed(0)
    base = torch.nn.Linear(128, 96, bias=False)
    layer = NF4Linear(base.weight)
    assert not any(p.requires_grad for p in layer.parameters()) and not list(layer.parameters())
    lora_a = torch.nn.Parameter(torch.randn(4, 128) * 0.1)
    lora_b = torch.nn.Parameter(torch.randn(96, 4) * 0.1)
    x = torch.randn(3, 128, requires_grad=True)
    y = layer(x) + (x @ lora_a.T) @ lora_b.T
    y.square().sum().backward()
    assert lora_a.grad is not None and lora_a.grad.abs().sum() > 0
    assert lora_b.grad is not None and lora_b.grad.abs().sum() > 0
    assert x.grad is not None and x.grad.abs().sum() > 0
    w = layer.dequantize()
    # the input's gradient goes through the dequantized weight
    expected = 2 * (x @ w.T + (x @ lora_a.T) @ lora_b.T) @ (w + lora_b @ lora_a)
    torch.testing.assert_close(x.grad, expected.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer(x.detach()), x.detach() @ w.T)


def test_nf4_decoder_replaces_decoder_linears(ckpt_untied):
    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.config import AsrConfig

    cfg = AsrConfig.from_file(ckpt_untied / "config.json")
    model = load_model(ckpt_untied, cfg, torch.device("cpu"), torch.float32)
    q_before = model.decoder.layers[0].self_attn.q_proj.weight.detach().clone()
    names = nf4_decoder(model)
    per_layer = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(names) == 7 * cfg.text.num_hidden_layers
    assert {n.rsplit(".", 1)[1] for n in names} == per_layer
    q = model.decoder.layers[0].self_attn.q_proj
    assert isinstance(q, NF4Linear)
    assert not any(isinstance(m, NF4Linear) for m in model.audio_tower.modules())
    torch.testing.assert_close(q.dequantize(), torch.from_numpy(reference(q_before.numpy(), True)).float())
