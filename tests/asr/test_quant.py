"""Weight-only int8 / int4 quantization: the quantizers, the kernels against dequantize + matmul, the
quantized model against the float one, weight bytes, and pre-quantized model folders."""

from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from dictation.asr import ModelError, WeightsError
from dictation.asr.checkpoints.safetensors import load_model
from dictation.asr.config import AsrConfig
from dictation.asr.nn import quant_format, quant_paths, quant_rows, quant_swap, quantized
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from dictation.asr.nn.quantized import Int4Linear, Int8Linear
from dictation.asr.tune import quantize, writers
from tests.oracle.checkpoints import active_token_ids, cached_checkpoint

CPU = torch.device("cpu")
# (out, in) of the tiny checkpoint's decoder layers: q, k/v, o, gate/up, down
TINY_SHAPES = [(2048, 64), (1024, 64), (64, 2048), (128, 64), (64, 128)]


@pytest.fixture(autouse=True)
def fresh_kernel_state(monkeypatch):
    """Every test starts with unprobed kernels, and leaves no trace (the policy is each layer's options)."""
    monkeypatch.setattr(quant_paths, "_KERNEL_OK", {})
    monkeypatch.setattr(quant_paths, "_CPU_DECODE_BF16", {})


def rand_weight(out_f, in_f, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out_f, in_f, generator=g) / in_f**0.5).to(dtype)


FLOAT32 = ModelOptions(cpu_bf16_compute=False)  # quantized layers compute in float32 on any CPU


def load(folder, dtype=torch.float32, options=DEFAULT_OPTIONS):
    model = load_model(folder, AsrConfig.from_file(folder / "config.json"), CPU, dtype)
    model.options = options
    return model


# --- quantizers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_round_trip_error_is_at_most_half_a_step(dtype):
    w = rand_weight(96, 160, seed=1, dtype=dtype)
    w[5] = 0.0  # an all-zero row: scale 1, no NaN
    m = Int8Linear.from_weight(w)
    assert m.weight.dtype == torch.int8 and m.weight_scale.dtype == torch.float32
    assert int(m.weight.abs().max()) == 127
    assert torch.equal(m.weight_scale, torch.where(w.float().abs().amax(1) > 0, w.float().abs().amax(1) / 127, 1.0))
    err = (w.float() - m.dequantize()).abs()
    assert torch.isfinite(m.dequantize()).all() and m.weight_scale[5] == 1 and err[5].max() == 0
    assert (err <= m.weight_scale[:, None] / 2 + 1e-6 * w.float().abs()).all()  # + float32 rounding of q * scale


def test_int8_is_exact_on_its_grid():
    g = torch.Generator().manual_seed(2)
    q = torch.randint(-127, 128, (32, 64), generator=g)
    q[:, 0] = torch.where(torch.arange(32) % 2 == 0, 127, -127)  # each row reaches the absmax
    scale = 2.0 ** -torch.randint(3, 12, (32, 1), generator=g).float()
    w = q.float() * scale
    m = Int8Linear.from_weight(w)
    assert torch.equal(m.weight, q.to(torch.int8)) and torch.equal(m.dequantize(), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_minmax_round_trip_error_is_at_most_half_a_group_step(monkeypatch, dtype):
    monkeypatch.setattr(quant_format, "INT4_METHOD", "minmax")
    w = rand_weight(48, 256, seed=3, dtype=dtype)
    w[7, 128:] = 0.25  # a constant group: scale 1, exact
    m = Int4Linear.from_weight(w, group_size=128)
    assert m.group_size == 128 and m.qweight.shape == (48, 128) and m.scales.shape == (48, 2)
    assert m.qweight.dtype == torch.uint8 and m.scales.dtype == m.zeros.dtype == torch.float32
    deq = m.dequantize()
    step = m.scales.repeat_interleave(128, dim=1)
    err = (w.float() - deq).abs()
    assert (err <= step / 2 + 1e-6 * w.float().abs()).all()
    assert m.scales[7, 1] == 1 and torch.equal(deq[7, 128:], w[7, 128:].float())
    q = quant_format.unpack_int4(m.qweight)
    assert int(q.max()) == 15 and int(q.min()) == 0


def numpy_int4_minmax(w: np.ndarray, group: int):
    """Round-to-nearest asymmetric int4 over each group's full range, written from the format's
    description alone (not from quantized.py): q in 0..15 as uint8 [out, in], scales, zeros [out, in/group]."""
    g = w.astype(np.float32).reshape(w.shape[0], -1, group)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = np.where(hi > lo, (hi - lo) / np.float32(15), np.float32(1)).astype(np.float32)
    q = np.clip(np.round((g - lo[..., None]) / scale[..., None]), 0, 15).astype(np.uint8)
    return q.reshape(w.shape), scale, lo


def numpy_unpack_int4(qweight: np.ndarray) -> np.ndarray:
    """uint8 [out, in/2] -> [out, in]: each byte's high nibble is the even input (the documented format)."""
    q = np.empty((qweight.shape[0], qweight.shape[1] * 2), np.uint8)
    q[:, 0::2], q[:, 1::2] = qweight >> 4, qweight & 0x0F
    return q


def numpy_dequantize(qweight, scales, zeros) -> np.ndarray:
    q = numpy_unpack_int4(np.asarray(qweight)).astype(np.float64)
    s, z = np.asarray(scales, np.float64), np.asarray(zeros, np.float64)
    group = q.shape[1] // s.shape[1]
    return (q.reshape(q.shape[0], -1, group) * s[..., None] + z[..., None]).reshape(q.shape)


def rel_error(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def test_minmax_is_round_to_nearest_over_the_group_range_as_numpy_computes_it():
    """The method format-1 folders were written with, checked against an independent implementation."""
    w = rand_weight(64, 512, seed=11)
    w[3, :64] = -0.5  # a constant group
    for group in (32, 64, 128, 256):
        qw, scales, zeros = quant_format.quantize_int4(w, group, method="minmax")
        q, s, z = numpy_int4_minmax(w.numpy(), group)
        assert np.array_equal(numpy_unpack_int4(qw.numpy()), q)
        assert np.array_equal(scales.numpy(), s) and np.array_equal(zeros.numpy(), z)


# Relative error sqrt(sum (w' - w)^2 / sum w^2) of round-to-nearest int4 over each group's full range on
# Gaussian weights: what the 16 steps across a group's range give (a group of 128 normal samples spans
# about 5.2 standard deviations, so a step is 0.35 of one and the error sqrt(1/12) of a step), measured
# with numpy_int4_minmax on 2^22 samples: 0.0998 at group 128, 0.0896 at 64, 0.0782 at 32. int8 (one
# scale per row of 2048) gives 0.0083: int4 is 12x further from the weights.
RTN_INT4_GAUSSIAN = {128: 0.0998, 64: 0.0896, 32: 0.0782}


@pytest.mark.parametrize("group", [128, 64, 32])
def test_int4_error_on_gaussian_weights_is_round_to_nearest_s_and_mse_lowers_it(group):
    w = torch.randn(512, 2048, generator=torch.Generator().manual_seed(5)) * 0.02
    exact = w.numpy().astype(np.float64)
    q, s, z = numpy_int4_minmax(w.numpy(), group)
    theory = rel_error(numpy_dequantize(quant_format.pack_int4(torch.from_numpy(q)).numpy(), s, z), exact)
    assert theory == pytest.approx(RTN_INT4_GAUSSIAN[group], abs=0.001)
    errors = {}
    for method in quant_format.INT4_METHODS:
        layer = Int4Linear.from_weight(w, group_size=group) if method == quant_format.INT4_METHOD else None
        qw, scales, zeros = quant_format.quantize_int4(w, group, method=method)
        errors[method] = rel_error(numpy_dequantize(qw.numpy(), scales.numpy(), zeros.numpy()), exact)
        if layer is not None:  # the layer holds what quantize_int4 gives with the default method
            assert torch.equal(layer.qweight, qw) and torch.equal(layer.scales, scales)
    assert errors["minmax"] == pytest.approx(theory, rel=1e-6)
    # mse: 6-7 % less error at every group size (0.0936 / 0.0846 / 0.0733 here)
    assert errors["mse"] <= 0.95 * errors["minmax"]


def test_mse_never_has_more_error_than_minmax_in_any_group():
    """It starts from the minmax grid and keeps a change only where it lowers that group's error: on
    heavy-tailed weights (what real checkpoints have more of) too, and for odd groups (constant, two
    values, one outlier)."""
    gen = torch.Generator().manual_seed(6)
    w = torch.distributions.StudentT(3.0).sample((128, 1024)) * 0.02
    w[0, :128] = 0.1  # constant
    w[1, :128] = torch.where(torch.arange(128) % 2 == 0, 0.1, -0.1)  # two values
    w[2, :128] = 0.0
    w[2, 5] = 3.0  # one outlier
    w[3] = torch.randn(1024, generator=gen) * 1e-30  # tiny
    w[4] = 1.0 + torch.randn(1024, generator=gen) * 1e-3  # far from 0 (float32 sums would cancel)
    exact = w.double().view(128, -1, 128)
    group_error = {}
    for method in quant_format.INT4_METHODS:
        qw, scales, zeros = quant_format.quantize_int4(w, 128, method=method)
        deq = torch.from_numpy(numpy_dequantize(qw.numpy(), scales.numpy(), zeros.numpy())).view(128, -1, 128)
        group_error[method] = (deq - exact).square().sum(-1)
        assert (scales > 0).all() and torch.isfinite(zeros).all()
    assert (group_error["mse"] <= group_error["minmax"] * (1 + 1e-6) + 1e-30).all()
    assert group_error["mse"][:3, 0].max() <= 1e-12  # constant and two-valued groups stay exact
    assert float(group_error["mse"].sum()) < 0.9 * float(group_error["minmax"].sum())


def test_an_unknown_int4_method_is_refused():
    with pytest.raises(ValueError, match="int4 method 'hqq' is not one of mse, minmax"):
        quant_format.quantize_int4(rand_weight(16, 64), 64, method="hqq")


# (out, in) per shape: 0.6B (hidden 1024, MLP 3072) and 1.7B (2048, 6144) decoder layers, fewer rows
REAL_K = [(96, 1024), (64, 3072), (96, 2048), (64, 6144)]


@pytest.mark.parametrize(("out_f", "in_f"), REAL_K)
@pytest.mark.parametrize("method", ["minmax", "mse"])
def test_int4_layers_at_the_real_widths_dequantize_independently_to_what_they_compute(monkeypatch, out_f, in_f, method):
    """The packed layer, read back by numpy from the documented format, is the weight within the
    method's error; and the CPU kernel's product for one row (fp32) is x times that numpy matrix.
    A packing or layout error at these widths (what the 1.7B model's int4 agreement could hide) fails."""
    monkeypatch.setattr(quant_format, "INT4_METHOD", method)
    w = torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(in_f)) * 0.02
    layer = Int4Linear.from_weight(w)
    layer.options = FLOAT32
    deq = numpy_dequantize(layer.qweight.numpy(), layer.scales.numpy(), layer.zeros.numpy())
    assert rel_error(deq, w.double().numpy()) <= RTN_INT4_GAUSSIAN[128] * 1.01
    assert np.allclose(layer.dequantize().double().numpy(), deq, rtol=0, atol=1e-7)
    x = torch.randn(1, in_f, generator=torch.Generator().manual_seed(1))
    assert layer._plan(x, 1) == (torch.float32, True)  # the kernel, not dequantize + matmul
    got = layer(x).double().numpy()
    expected = x.double().numpy() @ deq.T
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_fused_int4_rows_at_the_real_width_dequantize_independently_to_what_they_compute(monkeypatch):
    """The 1.7B model's fused q/k/v (2048 -> 2048 + 1024 + 1024 rows; fewer here) through one kernel."""
    gen = torch.Generator().manual_seed(8)
    weights = [torch.randn(rows, 2048, generator=gen) * 0.02 for rows in (64, 32, 32)]
    fused = quant_rows.fuse_rows([Int4Linear.from_weight(w) for w in weights])
    fused.options = FLOAT32
    deq = numpy_dequantize(fused.qweight.numpy(), fused.scales.numpy(), fused.zeros.numpy())
    assert rel_error(deq, torch.cat(weights).double().numpy()) <= RTN_INT4_GAUSSIAN[128]
    x = torch.randn(1, 2048, generator=gen)
    expected = x.double().numpy() @ deq.T
    assert np.abs(fused(x).double().numpy() - expected).max() <= 1e-5 * np.abs(expected).max()


def test_int4_is_exact_on_its_grid():
    g = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (16, 128), generator=g)
    q[:, 0::64], q[:, 1::64] = 0, 15  # each group spans 0..15
    scale = 2.0 ** -torch.randint(4, 10, (16, 2, 1), generator=g).float()
    low = torch.randint(-64, 0, (16, 2, 1), generator=g).float() * scale
    w = (q.view(16, 2, 64).float() * scale + low).view(16, 128)
    m = Int4Linear.from_weight(w, group_size=64)
    assert torch.equal(quant_format.unpack_int4(m.qweight), q.to(torch.uint8))
    assert torch.equal(m.dequantize(), w)


def test_int4_nibble_order_is_high_nibble_first():
    q = torch.tensor([[1, 2, 3, 4], [15, 0, 0, 15]], dtype=torch.uint8)
    packed = quant_format.pack_int4(q)
    assert packed.tolist() == [[0x12, 0x34], [0xF0, 0x0F]]
    assert torch.equal(quant_format.unpack_int4(packed), q)


def test_nonfinite_weights_are_refused():
    w = rand_weight(16, 64)
    w[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinity"):
        Int8Linear.from_weight(w)
    with pytest.raises(ValueError, match="NaN or infinity"):
        Int4Linear.from_weight(w)


@pytest.mark.parametrize(
    ("in_features", "group_size", "expected"),
    [(64, 128, 64), (128, 128, 128), (2048, 128, 128), (192, 128, 64), (96, 128, 32), (160, 128, 32), (256, 64, 64)],
)
def test_group_size_falls_back_for_narrow_layers(in_features, group_size, expected):
    assert quant_format.pick_group_size(in_features, group_size) == expected
    assert Int4Linear(in_features, 16, group_size=group_size).group_size == expected


def test_unsupported_group_sizes_are_refused():
    with pytest.raises(ValueError, match="in_features 100"):
        Int4Linear(100, 16)
    with pytest.raises(ValueError, match="int4 needs in_features divisible by 32, 64 or 128"):
        quant_format.pick_group_size(48)
    with pytest.raises(ValueError, match="group size 100 is not supported"):
        quant_format.pick_group_size(128, 100)


def test_modules_behave_like_bias_free_linears():
    with pytest.raises(ValueError, match="no bias"):
        Int8Linear(64, 32, bias=True)
    m4 = Int4Linear.from_weight(rand_weight(32, 64))
    m8 = Int8Linear.from_weight(rand_weight(32, 64))
    assert (m4.in_features, m4.out_features) == (m8.in_features, m8.out_features) == (64, 32)
    assert "int4 group_size=64" in repr(m4) and "int8" in repr(m8)
    assert set(m8.state_dict()) == {"weight", "weight_scale"}
    assert set(m4.state_dict()) == {"qweight", "scales", "zeros"}
    x = torch.randn(2, 3, 64)
    assert m4(x).shape == m8(x).shape == (2, 3, 32)
    # a dtype cast moves nothing to bf16: the scales stay float32, the integers stay integers
    m4.to(torch.bfloat16)
    m8.half()
    assert m4.scales.dtype == m4.zeros.dtype == m8.weight_scale.dtype == torch.float32
    assert m4.qweight.dtype == torch.uint8 and m8.weight.dtype == torch.int8


# --- kernels against dequantize + matmul ------------------------------------------------------------------


def _tolerance(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [*TINY_SHAPES, (256, 512)])
def test_cpu_kernel_equals_dequantize_matmul(kind, dtype, shape):
    w = rand_weight(*shape, seed=5)
    m = Int8Linear.from_weight(w) if kind == "int8" else Int4Linear.from_weight(w)
    assert m._kernel_fits(CPU, dtype)
    assert quantized._kernel_available(kind, CPU, dtype), f"torch {torch.__version__} lacks the {kind} CPU kernel"
    for rows in (1, 5, 40):
        x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows)).to(dtype)
        ref = x.float() @ m.dequantize().T
        got = m._kernel(x, dtype).float()
        assert (got - ref).abs().max() <= _tolerance(dtype) * ref.abs().max(), (kind, dtype, shape, rows)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("bf16_compute", [False, True])
@pytest.mark.parametrize("use_kernels", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 200])
def test_forward_equals_reference_on_every_path(kind, bf16_compute, use_kernels, rows):
    w = rand_weight(256, 512, seed=6)
    m = Int8Linear.from_weight(w) if kind == "int8" else Int4Linear.from_weight(w)
    m.options = ModelOptions(cpu_bf16_compute=bf16_compute, quant_kernels=use_kernels)
    x = torch.randn(1, rows, 512, generator=torch.Generator().manual_seed(7))
    dtype, kernel = m._plan(x, rows)
    assert dtype == (torch.bfloat16 if bf16_compute else torch.float32)
    assert kernel == (use_kernels and rows <= (quantized.KERNEL_MAX_ROWS[("cpu", kind)] if bf16_compute else 1))
    y = m(x)
    assert y.dtype == torch.float32 and y.shape == (1, rows, 256)
    ref = x @ m.dequantize().T
    tol = 1e-2 if bf16_compute else 1e-5
    assert (y - ref).abs().max() <= tol * ref.abs().max()


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("bf16_wins", [False, True])
def test_decode_rows_use_the_bf16_kernel_where_it_wins_on_a_float32_cpu(monkeypatch, kind, bf16_wins):
    """A CPU without bf16 instructions computes in float32, but torch's float32 int8/int4 kernels are
    scalar loops: decode-sized calls go through the bf16 kernel where it was timed faster; the prefill
    (more rows) stays float32."""
    monkeypatch.setattr(quant_paths, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(quant_paths, "_CPU_DECODE_BF16", {kind: bf16_wins})
    w = rand_weight(256, 512, seed=8)
    m = Int8Linear.from_weight(w) if kind == "int8" else Int4Linear.from_weight(w)
    limit = quantized.KERNEL_MAX_ROWS[("cpu", kind)]
    for rows in (1, limit, limit + 1, 200):
        x = torch.randn(1, rows, 512, generator=torch.Generator().manual_seed(rows))
        dtype, kernel = m._plan(x, rows)
        if bf16_wins and rows <= limit:
            assert (dtype, kernel) == (torch.bfloat16, True), rows
        else:
            assert dtype == torch.float32 and kernel == (rows == 1), rows
        y = m(x)
        assert y.dtype == torch.float32
        ref = x @ m.dequantize().T
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        assert (y - ref).abs().max() <= tol * ref.abs().max(), rows
    m.options = FLOAT32  # off: float32 for every row
    assert m._plan(torch.zeros(1, 1, 512), 1) == (torch.float32, True)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("slow", ["bf16", "float32"])
def test_the_decode_dtype_is_chosen_by_timing_once(monkeypatch, kind, slow):
    import time

    cls = Int8Linear if kind == "int8" else Int4Linear
    real = cls._torch_kernel
    calls = []

    def timed(self, x2d, dtype):
        calls.append(dtype)
        if (dtype == torch.bfloat16) == (slow == "bf16"):
            time.sleep(0.05)  # far slower than either kernel, even on a busy machine
        return real(self, x2d, dtype)

    monkeypatch.setattr(cls, "_torch_kernel", timed)
    assert quantized._bf16_decode_wins(kind) is (slow == "float32")
    assert torch.bfloat16 in calls and torch.float32 in calls
    calls.clear()
    assert quantized._bf16_decode_wins(kind) is (slow == "float32")
    assert calls == []  # remembered for the process


def test_int4_keeps_one_packed_copy_for_every_dtype():
    m = Int4Linear.from_weight(rand_weight(64, 256))
    packed32, _ = m._packed_for(torch.float32)
    packed16, sz16 = m._packed_for(torch.bfloat16)
    assert packed16 is packed32 and sz16.dtype == torch.bfloat16


def test_a_kernel_giving_wrong_numbers_raises(monkeypatch):
    monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu", lambda x, w, g, sz: torch.zeros(x.shape[0], 64))
    m = Int4Linear.from_weight(rand_weight(64, 256))
    with pytest.raises(RuntimeError, match="int4 weight-only kernel on cpu .* gives wrong results"):
        m(torch.randn(1, 256))


def test_a_missing_kernel_falls_back(monkeypatch):
    def missing(*args):
        raise NotImplementedError("no kernel for this build")

    monkeypatch.setattr(torch, "_weight_int8pack_mm", missing)
    m = Int8Linear.from_weight(rand_weight(64, 256))
    x = torch.randn(1, 256)
    assert torch.allclose(m(x), x @ m.dequantize().T, rtol=1e-2, atol=1e-2)
    assert not any(quant_paths._KERNEL_OK.values())


def test_kernel_is_not_used_for_shapes_it_mishandles():
    # torch's CPU bf16 int8 kernel crashes or answers garbage when in_features is not a multiple of 16
    m = Int8Linear.from_weight(rand_weight(16, 40))
    assert not m._kernel_fits(CPU, torch.bfloat16)
    x = torch.randn(1, 40)
    assert torch.allclose(m(x), x @ m.dequantize().T, rtol=1e-2, atol=1e-2)


# --- the quantized model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp32_model(ckpt_untied):
    return load(ckpt_untied)


def decoder_linear_names(n_layers):
    return {f"decoder.layers.{i}.{m}" for i in range(n_layers) for m in quant_format.LAYER_MODULES}


def quantized_copy(folder, variant, options=DEFAULT_OPTIONS, **kwargs):
    model = load(folder)
    names = quantize.quantize_model(model, variant, **kwargs)
    model.options = options  # handed to the new layers too
    return model, names


def prompt_embeds(model):
    ids = active_token_ids()[100:140]
    return model.decoder.embed_tokens(ids).unsqueeze(0)


def teacher_forced_logits(model, tokens):
    """Prefill logits, then one step per reference token (so a flipped argmax cannot derail the rest)."""
    embeds = prompt_embeds(model)
    logits = [model.prefill(embeds, 32).float()]
    for i, t in enumerate(tokens):
        logits.append(model.step(torch.tensor([t]), embeds.shape[1] + i).float())
    return logits


def greedy_ids(model, n=12):
    embeds = prompt_embeds(model)
    ids = [int(model.prefill(embeds, 32).argmax())]
    for i in range(n):
        ids.append(int(model.step(torch.tensor([ids[-1]]), embeds.shape[1] + i).argmax()))
    return ids


def cos(a, b):
    return float(F.cosine_similarity(a, b, dim=0))


@pytest.mark.parametrize("variant", ["int8", "int4"])
def test_quantize_model_replaces_only_decoder_linears(ckpt_untied, fp32_model, variant):
    model, names = quantized_copy(ckpt_untied, variant)
    n_layers = model.cfg.text.num_hidden_layers
    assert set(names) == decoder_linear_names(n_layers) == set(quant_swap.quantizable_linears(fp32_model))
    cls = Int8Linear if variant == "int8" else Int4Linear
    for name, module in model.named_modules():
        if name in names:
            assert type(module) is cls
        elif isinstance(module, nn.Linear):
            assert module.weight.dtype == torch.float32 and not name.startswith("decoder.layers.")
    ref = dict(fp32_model.named_parameters())
    for name, p in model.named_parameters():  # encoder, embeddings, head, norms: untouched
        assert torch.equal(p, ref[name]), name
    assert model.lm_head is not None and type(model.lm_head) is nn.Linear
    assert quant_swap.quantizable_linears(model) == {}
    with pytest.raises(ValueError, match="already quantized"):
        quantize.quantize_model(model, variant)


@pytest.mark.parametrize(("variant", "min_cos", "spread"), [("int8", 0.985, 0.1), ("int4", 0.7, 0.15)])
def test_quantized_logits_stay_close_to_fp32(monkeypatch, ckpt_untied, fp32_model, variant, min_cos, spread):
    # Measured on the tiny checkpoint (fp32 compute): int8 0.992 at the prefill; int4 (mse) 0.80 at the
    # prefill, 0.785 on average over the 13 steps, 0.60 at the worst (minmax: 0.78, 0.776, 0.65; mse
    # rounds these weights 6 % closer, 0.0871 vs 0.0926, and which step is worst is chance). The tiny
    # model is far more sensitive than a real one (random weights, sharp attention); a broken int4
    # quantizer (swapped nibbles, zeros off by half a step) scores 0.17-0.47 at the prefill and
    # 0.09-0.31 on average.
    ref_ids = greedy_ids(fp32_model)
    ref = teacher_forced_logits(fp32_model, ref_ids[:-1])
    model, _ = quantized_copy(ckpt_untied, variant, FLOAT32)
    got = teacher_forced_logits(model, ref_ids[:-1])
    cosines = [cos(a, b) for a, b in zip(ref, got, strict=True)]
    assert cosines[0] > min_cos and sum(cosines) / len(cosines) > min_cos, cosines
    assert min(cosines) > min_cos - spread, cosines
    if variant == "int8":  # where fp32's top-2 margin exceeds a logit, int8 picks the same token
        for a, b in zip(ref, got, strict=True):
            top = a.topk(2).values
            if top[0] - top[1] > 1.0:
                assert int(a.argmax()) == int(b.argmax())


@pytest.mark.parametrize("variant", ["int8", "int4"])
@pytest.mark.parametrize("bf16_compute", [False, True])
def test_quantized_model_equals_its_dequantized_float_twin(monkeypatch, ckpt_untied, variant, bf16_compute):
    """The quantized layers compute what a float model holding dequantize() computes: this isolates
    the kernels and the module plumbing from the (expected) quantization error."""
    model, names = quantized_copy(ckpt_untied, variant, ModelOptions(cpu_bf16_compute=bf16_compute))
    twin = load(ckpt_untied)
    for name, linear in quant_swap.quantizable_linears(twin).items():
        linear.weight.copy_(model.get_submodule(name).dequantize())
    ids = greedy_ids(twin)
    got, ref = teacher_forced_logits(model, ids[:-1]), teacher_forced_logits(twin, ids[:-1])
    cosines = [cos(a, b) for a, b in zip(ref, got, strict=True)]
    if bf16_compute:
        assert min(cosines) > 0.99, cosines
    else:
        assert min(cosines) > 0.99999, cosines
        assert greedy_ids(model) == ids


def test_quantize_model_takes_replacement_weights(ckpt_untied, fp32_model):
    name = "decoder.layers.1.mlp.up_proj"
    w = quant_swap.quantizable_linears(fp32_model)[name].weight * 2
    model, _ = quantized_copy(ckpt_untied, "int8", weights={name: w})
    assert torch.equal(model.get_submodule(name).weight, Int8Linear.from_weight(w).weight)
    assert torch.equal(model.get_submodule(name).weight_scale, Int8Linear.from_weight(w).weight_scale)
    with pytest.raises(ValueError, match="not a quantizable decoder linear layer"):
        quantize.quantize_model(load(ckpt_untied), "int8", weights={"lm_head": w})
    with pytest.raises(ValueError, match="not a quantized variant"):
        quantize.quantize_model(load(ckpt_untied), "bf16")
    untouched = load(ckpt_untied)
    with pytest.raises(ValueError, match=r"has shape \(64, 128\), expected \(128, 64\)"):
        quantize.quantize_model(untouched, "int4", weights={name: w.T})
    assert len(quant_swap.quantizable_linears(untouched)) == 14  # checked before anything was replaced


def test_replace_linear_requantizes_in_place(ckpt_untied):
    model, _ = quantized_copy(ckpt_untied, "int4")
    name = "decoder.layers.0.self_attn.k_proj"
    w = rand_weight(1024, 64, seed=9)
    new = quantize.replace_linear(model, name, "int4", w)
    assert model.get_submodule(name) is new
    assert torch.equal(new.qweight, Int4Linear.from_weight(w).qweight)
    with pytest.raises(ValueError, match=r"shape \(64, 1024\), expected \(1024, 64\)"):
        quantize.replace_linear(model, name, "int4", w.T)


def test_weight_bytes_counts_what_each_variant_holds(ckpt_untied, fp32_model):
    t = fp32_model.cfg.text
    shapes = [tuple(m.weight.shape) for m in quant_swap.quantizable_linears(fp32_model).values()]
    assert len(shapes) == 7 * t.num_hidden_layers
    linear_fp32 = sum(4 * o * i for o, i in shapes)
    total = quantize.weight_bytes(fp32_model)
    assert total == sum(p.numel() * 4 for p in fp32_model.parameters())  # no persistent buffers in the float model
    int8 = sum(o * i + 4 * o for o, i in shapes)
    int4 = sum(o * i // 2 + 8 * o * (i // quant_format.pick_group_size(i)) for o, i in shapes)
    m8, _ = quantized_copy(ckpt_untied, "int8")
    m4, _ = quantized_copy(ckpt_untied, "int4")
    assert quantize.weight_bytes(m8) == total - linear_fp32 + int8
    assert quantize.weight_bytes(m4) == total - linear_fp32 + int4
    # 1 byte per weight + a float32 scale per row; 1/2 byte + two float32 per group (64 or 128 wide here)
    assert 1 / 4 < int8 / linear_fp32 < 1 / 4 + 1 / 64
    assert 1 / 8 < int4 / linear_fp32 < 1 / 8 + 1 / 32
    assert quantize.format_bytes(1_234_567_890) == "1.23 GB" and quantize.format_bytes(999) == "999 B"


# --- pre-quantized folders --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(ckpt_root, tmp_path_factory):
    """(source, pre-quantized folder) per (layout, variant), written once."""
    root = tmp_path_factory.mktemp("quantized")
    cache = {}

    def get(layout, variant):
        if (layout, variant) not in cache:
            src = cached_checkpoint(ckpt_root, layout=layout)
            out = writers.write_quantized_folder(src, root / f"{layout}-{variant}", variant)
            cache[layout, variant] = src, out
        return cache[layout, variant]

    return get


def quantized_buffers(model):
    return {k: v for k, v in model.state_dict().items() if k.endswith(("weight_scale", "qweight", "scales", "zeros"))}


@pytest.mark.parametrize("layout", ["thinker", "hf"])
@pytest.mark.parametrize("variant", ["int8", "int4"])
def test_prequantized_folder_loads_to_the_same_model(monkeypatch, written, layout, variant):
    src, out = written(layout, variant)
    src_files = {p.name for p in src.iterdir()} - {"model.safetensors"}
    assert {p.name for p in out.iterdir()} == src_files | {"model.safetensors"}
    for name in src_files - {"config.json"}:
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    raw = json.loads((out / "config.json").read_text())
    qc = raw.pop("quantization_config")
    assert raw == json.loads((src / "config.json").read_text())
    assert qc == quantize.quantization_config(variant)
    assert qc["quant_method"] == "dictation" and qc["variant"] == variant and qc["format_version"] == 1
    cfg = AsrConfig.from_file(out / "config.json")
    assert cfg.quantization == qc and cfg.layout == layout

    loaded = load(out, options=FLOAT32)
    expected, _ = quantized_copy(src, variant, FLOAT32)
    cls = Int8Linear if variant == "int8" else Int4Linear
    assert {n for n, m in loaded.named_modules() if type(m) is cls} == decoder_linear_names(2)
    want = expected.state_dict()
    for k, v in loaded.state_dict().items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
    assert quantized_buffers(loaded)
    embeds = prompt_embeds(loaded)
    assert torch.equal(loaded.prefill(embeds, 8), expected.prefill(embeds, 8))


def test_prequantized_folder_keeps_float_tensors_in_their_stored_dtype(ckpt_untied, tmp_path):
    src = tmp_path / "bf16"
    shutil.copytree(ckpt_untied, src)
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(src / "model.safetensors"))
    out = writers.write_quantized_folder(src, tmp_path / "int4", "int4", group_size=64)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    name = "thinker.model.layers.0.mlp.down_proj"
    assert stored[f"{name}.qweight"].dtype == torch.uint8 and stored[f"{name}.scales"].dtype == torch.float32
    assert f"{name}.weight" not in stored
    assert stored["thinker.model.embed_tokens.weight"].dtype == torch.bfloat16
    assert stored["thinker.audio_tower.proj1.weight"].dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["quantization_config"]["group_size"] == 64
    # same numbers as quantizing the bf16 model loaded in fp32 at load time
    expected, _ = quantized_copy(src, "int4", group_size=64)
    loaded = load(out)
    assert quantized_buffers(loaded).keys() == quantized_buffers(expected).keys()
    for k, v in quantized_buffers(loaded).items():
        assert torch.equal(v, quantized_buffers(expected)[k]), k
    # loading into bf16: floats in bf16, quantized tensors as stored
    half = load(out, torch.bfloat16)
    ours = "decoder.layers.0.mlp.down_proj"
    assert half.dtype == torch.bfloat16 and half.get_submodule(ours).scales.dtype == torch.float32
    assert torch.equal(half.get_submodule(ours).qweight, loaded.get_submodule(ours).qweight)


def test_a_folder_written_before_int4_method_existed_loads_as_it_always_did(ckpt_untied, tmp_path, monkeypatch):
    """Same stored format: a minmax folder without ``int4_method`` (format 1 as first written) loads
    to the minmax-quantized model, while a new folder records mse and holds different numbers."""
    monkeypatch.setattr(quant_format, "INT4_METHOD", "minmax")
    old = writers.write_quantized_folder(ckpt_untied, tmp_path / "old", "int4", group_size=64)
    expected, _ = quantized_copy(ckpt_untied, "int4", group_size=64)
    config = json.loads((old / "config.json").read_text())
    assert config["quantization_config"].pop("int4_method") == "minmax"
    (old / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(quant_format, "INT4_METHOD", "mse")
    loaded = load(old)
    assert quantized_buffers(loaded).keys() == quantized_buffers(expected).keys()
    for k, v in quantized_buffers(loaded).items():
        assert torch.equal(v, quantized_buffers(expected)[k]), k
    new = writers.write_quantized_folder(ckpt_untied, tmp_path / "new", "int4", group_size=64)
    assert AsrConfig.from_file(new / "config.json").quantization["int4_method"] == "mse"
    name = "decoder.layers.0.mlp.down_proj"
    assert not torch.equal(load(new).get_submodule(name).scales, loaded.get_submodule(name).scales)


def test_the_bench_rewrites_a_cached_folder_quantized_another_way(ckpt_untied, tmp_path, monkeypatch):
    from dictation.bench.checkpoints import prequantized_folder

    messages = []
    folder, took = prequantized_folder(ckpt_untied, tmp_path, "int4", 64, log=messages.append)
    assert took is not None
    assert prequantized_folder(ckpt_untied, tmp_path, "int4", 64, log=messages.append) == (folder, None)
    monkeypatch.setattr(quant_format, "INT4_METHOD", "minmax")
    again, took = prequantized_folder(ckpt_untied, tmp_path, "int4", 64, log=messages.append)
    assert again == folder and took is not None
    assert AsrConfig.from_file(folder / "config.json").quantization["int4_method"] == "minmax"


def test_write_refuses_bad_requests(ckpt_untied, written, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match=f"{busy}: already exists and is not an empty folder"):
        writers.write_quantized_folder(ckpt_untied, busy, "int8")
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    _, already = written("thinker", "int8")
    with pytest.raises(ModelError, match=r"config.json: this model is already quantized \(int8\)"):
        writers.write_quantized_folder(already, tmp_path / "again", "int4")
    for bad in ("int3", "bf16"):
        with pytest.raises(ModelError, match=f"{ckpt_untied}: cannot quantize to '{bad}'; choose one of int8, int4"):
            writers.write_quantized_folder(ckpt_untied, tmp_path / "bad", bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert writers.write_quantized_folder(ckpt_untied, empty, "int8") == empty  # an empty folder is fine
    assert (empty / "model.safetensors").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o077])
def test_written_folder_follows_the_umask_like_any_other_tool(ckpt_untied, tmp_path, umask):
    """Every file of a written model folder, the weights included, has the umask's mode (safetensors
    alone writes 0600), and so does the folder: a model is not private data."""
    old = os.umask(umask)
    try:
        out = writers.write_quantized_folder(ckpt_untied, tmp_path / "int8", "int8")
    finally:
        os.umask(old)
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()}
    assert "model.safetensors" in files and "config.json" in files and len(files) > 2
    assert files == dict.fromkeys(files, 0o666 & ~umask)
    folders = [out, *(p for p in out.rglob("*") if p.is_dir())]
    assert {stat.S_IMODE(p.stat().st_mode) for p in folders} == {0o777 & ~umask}


def test_interrupted_write_leaves_nothing(ckpt_untied, tmp_path, monkeypatch):
    from dictation.asr.checkpoints import output

    def fail(*args, **kwargs):  # the weights file has its header and no tensor yet
        raise KeyboardInterrupt

    monkeypatch.setattr(output, "tensor_bytes", fail)
    with pytest.raises(KeyboardInterrupt):
        writers.write_quantized_folder(ckpt_untied, tmp_path / "out", "int4")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("qc", "message"),
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'.*only this app's own"),
        ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
        ({"quant_method": "dictation", "format_version": 2, "variant": "int8"}, "format_version 2, newer"),
        ({"quant_method": "dictation", "format_version": 1, "variant": "int2"}, "variant 'int2'"),
        ({"quant_method": "dictation", "format_version": 1, "variant": "int4", "group_size": 100}, "group_size 100"),
        (
            {"quant_method": "dictation", "format_version": 1, "variant": "int4", "group_size": "128"},
            "group_size '128'",
        ),
        ("int4", "not a JSON object"),
    ],
)
def test_foreign_or_bad_quantization_configs_are_refused(ckpt_untied, tmp_path, qc, message):
    folder = tmp_path / "m"
    shutil.copytree(ckpt_untied, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelError, match=f"{folder / 'config.json'}: quantization_config .*{message}"):
        AsrConfig.from_file(folder / "config.json")
    with pytest.raises(ModelError, match=f"{folder / 'config.json'}: quantization_config"):
        writers.write_quantized_folder(folder, tmp_path / "out", "int8")


def test_variant_comes_from_metadata_never_from_the_name(ckpt_untied, written, tmp_path):
    named = tmp_path / "Qwen3-ASR-int8"
    shutil.copytree(ckpt_untied, named)
    model = load(named)
    assert AsrConfig.from_file(named / "config.json").quantization is None
    assert not any(isinstance(m, quantized.QUANT_MODULES) for m in model.modules())
    # a quantized folder whose config lost its quantization_config is refused with a hint
    _, out = written("thinker", "int4")
    stripped = tmp_path / "stripped"
    shutil.copytree(out, stripped)
    raw = json.loads((stripped / "config.json").read_text())
    del raw["quantization_config"]
    (stripped / "config.json").write_text(json.dumps(raw))
    with pytest.raises(WeightsError, match="unexpected tensor .*a quantized folder whose config.json lacks"):
        load(stripped)


def test_prequantized_tensors_are_checked(written, tmp_path):
    _, out = written("thinker", "int4")
    folder = tmp_path / "m"
    shutil.copytree(out, folder)
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    name = "thinker.model.layers.1.self_attn.o_proj.qweight"
    tensors[name] = tensors[name].view(torch.int8)
    save_file(tensors, str(path))
    with pytest.raises(WeightsError, match=f"{path}: tensor {name} is torch.int8, expected torch.uint8"):
        load(folder)
    del tensors[name]
    save_file(tensors, str(path))
    with pytest.raises(WeightsError, match=rf"{path}: missing tensor {name} \(expected shape \(64, 1024\)\)"):
        load(folder)


def test_an_int8_prefill_on_the_cpu_widens_its_weight_a_piece_of_rows_at_a_time(monkeypatch):
    """The widened float32 weight is the prefill's largest temporary (25 MB for the 0.6B's gate/up):
    on the CPU it is made a piece of output rows at a time, with the same numbers."""
    monkeypatch.setattr(quantized, "DEQUANTIZE_PIECE_ROWS", 64)
    m = Int8Linear.from_weight(rand_weight(200, 96, seed=9))
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(10))
    widths = []
    linear = F.linear

    def spy(inp, weight, *args):
        widths.append(weight.shape[0])
        return linear(inp, weight, *args)

    monkeypatch.setattr(quantized.F, "linear", spy)
    y = m._dequantize_matmul(x)
    assert widths == [64, 64, 64, 8]
    torch.testing.assert_close(y, linear(x, m.weight.float()) * m.weight_scale, rtol=1e-6, atol=1e-6)
