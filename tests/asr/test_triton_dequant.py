"""The one-pass int4 dequantization (dictation/asr/nn/kernels/triton_dequant.py) without a GPU: in
Triton's interpreter (a child process with ``TRITON_INTERPRET=1``) against torch's chain of operations,
compiled ahead of time for sm_80/89/90, and how quantized.py takes it or leaves it."""

from __future__ import annotations

import logging
import re
import textwrap

import pytest
import torch

from dictation.asr.nn import quant_paths, quantized
from dictation.asr.nn.kernels import triton_dequant
from tests.asr.interpreter import run_interpreted

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from dictation.asr.nn import quantized
    from dictation.asr.nn.kernels import triton_dequant
    from dictation.asr.nn.quant_format import unpack_int4
    from dictation.asr.nn.options import ModelOptions
    from dictation.asr.nn.quantized import Int4Linear

    def truncated(x):  # float32 -> bfloat16 by dropping the low bits: what the interpreter's cast does
        return (x.view(torch.int32) & ~0xFFFF).view(torch.float32)

    gen = torch.Generator().manual_seed(3)
    # (out, in, group): sizes off the block multiple, every group size, one of 1.7B's layers
    SHAPES = [(24, 2304, 64), (7, 96, 32), (5, 4096, 128), (3, 512, 256), (2, 6144, 128)]
    report = {"fp16": [], "bf16": [], "usable": {}, "layer": None}
    for out_f, in_f, group in SHAPES:
        layer = Int4Linear.from_weight(torch.randn(out_f, in_f, generator=gen) / 16, group_size=group)
        scale, mid = layer._half_scales(torch.float16)
        got = triton_dequant.int4_dequantize(layer.qweight, scale, mid, group)
        report["fp16"].append([out_f, in_f, group, got.dtype == torch.float16,
                               torch.equal(got, layer.torch_dequantized(torch.float16))])
        scale, mid = layer._half_scales(torch.bfloat16)
        got = triton_dequant.int4_dequantize(layer.qweight, scale, mid, group)
        q = unpack_int4(layer.qweight).view(out_f, -1, group).float() - 8
        product = truncated(q * scale.float()[..., None])
        want = truncated(product + mid.float()[..., None]).view(out_f, in_f)
        report["bf16"].append([out_f, in_f, group, got.dtype == torch.bfloat16, torch.equal(got.float(), want)])
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        report["usable"][name] = quantized.one_pass_dequantize_usable(torch.device("cpu"), dtype)
    # A layer's product of many rows through the kernel (fp16: the CPU's int4 kernels take one row).
    layer = Int4Linear.from_weight(torch.randn(64, 256, generator=gen) / 16, group_size=128)
    # compute in the activations' fp16, and dequantize in one pass on the CPU too
    layer.options = ModelOptions(one_pass_dequantize=("cpu",), cpu_bf16_compute=False)
    x = torch.randn(40, 256, generator=gen).to(torch.float16)
    calls = []
    real = triton_dequant.int4_dequantize
    triton_dequant.int4_dequantize = lambda *a: calls.append(1) or real(*a)
    y = layer(x)
    want = torch.nn.functional.linear(x, layer.torch_dequantized(torch.float16))
    report["layer"] = [len(calls), torch.equal(y, want)]
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT)


def test_the_kernel_gives_torchs_bits(interpreted):
    """fp16: torch's weights exactly. bf16: the interpreter casts float32 to bf16 by truncation (a GPU
    rounds to nearest, as torch does), so there it equals torch's formula with truncating casts."""
    assert len(interpreted["fp16"]) == 5 and all(dtype_ok and same for *_, dtype_ok, same in interpreted["fp16"])
    assert len(interpreted["bf16"]) == 5 and all(dtype_ok and same for *_, dtype_ok, same in interpreted["bf16"])


def test_the_check_takes_it_where_it_gives_torchs_bits_and_leaves_it_elsewhere(interpreted):
    # In the interpreter bf16 differs from torch (truncating casts): the check must leave it out.
    assert interpreted["usable"] == {"fp16": True, "bf16": False}


def test_an_int4_layer_multiplying_many_rows_dequantizes_through_it(interpreted):
    assert interpreted["layer"] == [1, True]


def compile_for(capability: int, dtype: str, group: int, aligned: bool):
    """The kernel compiled ahead of time by Triton's compiler (PTX and a cubin, no GPU needed), with the
    options it is launched with. ``aligned``: pointers and sizes divisible by 16, as the decoder's are."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointers = {"w_ptr": "*u8", "scale_ptr": f"*{dtype}", "mid_ptr": f"*{dtype}", "out_ptr": f"*{dtype}"}
    ints = dict.fromkeys(("KB", "stride_s"), "i32")
    signature = {**pointers, **ints, "GROUP": "constexpr", "BLOCK": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers) + len(ints))} if aligned else None
    constexprs = {"GROUP": group, "BLOCK": triton_dequant.BLOCK}
    source = ASTSource(fn=triton_dequant.raw_kernel(), signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": triton_dequant.WARPS, "enable_fp_fusion": False}
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


@pytest.mark.parametrize("capability", [80, 89, 90])
def test_the_kernel_compiles_for_real_gpus_reads_and_writes_vectors_and_rounds_twice(capability):
    """Each thread reads its bytes as one vector and writes its weights as 16-byte vectors; the product
    and the sum stay two rounded operations (no single-rounding multiply-add, unlike torch)."""
    for dtype in ("bf16", "fp16"):
        for group in (32, 128, 256):
            kernel = compile_for(capability, dtype, group, aligned=True)
            ptx = kernel.asm["ptx"]
            assert kernel.asm.get("cubin"), f"no cubin for sm_{capability}"
            assert re.findall(r"ld\.global\.v2\.b32", ptx) and re.findall(r"st\.global\.v4\.b32", ptx), (dtype, group)
            assert not re.findall(r"ld\.global\.(?:\w+\.)?b8", ptx), (dtype, group)
            kind = "bf16" if dtype == "bf16" else "f16"
            muls, adds = re.findall(rf"\bmul\.rn\.{kind}\b", ptx), re.findall(rf"\badd\.rn\.{kind}\b", ptx)
            fmas = re.findall(rf"\bfma\.rn\.{kind}\b", ptx)
            # sm_80/89 have no bf16 multiply or add: each is an fma with 1 or -0.0 (still rounded alone).
            assert (len(muls) == len(adds) > 0 and not fmas) or (dtype == "bf16" and capability < 90 and fmas)
            if fmas:
                assert len(fmas) % 2 == 0 and not muls and not adds
    assert compile_for(capability, "bf16", 64, aligned=False).asm.get("cubin")  # odd sizes


def test_misfit_inputs_are_refused_with_their_shapes():
    q, s = torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8, 1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"qweight \(8, 64\) torch.uint8, scale \(8, 1\) torch.bfloat16"):
        triton_dequant.int4_dequantize(q, s, s, 64)  # 128 inputs are 2 groups of 64
    with pytest.raises(ValueError, match="do not fit"):
        triton_dequant.int4_dequantize(q, s.float(), s.float(), 128)  # float32 weights: torch's formula differs
    with pytest.raises(ValueError, match="do not fit"):
        triton_dequant.int4_dequantize(q.view(torch.int8), s, s, 128)
    with pytest.raises(ValueError, match="do not fit"):
        triton_dequant.int4_dequantize(torch.zeros(8, 66, dtype=torch.uint8)[:, 2:], s, s, 128)


def test_a_kernel_that_fails_or_differs_is_left_out_with_one_log_line(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="dictation.asr.nn.quant_paths")
    monkeypatch.setattr(quant_paths, "_ONE_PASS_OK", {})

    def broken(*args):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(triton_dequant, "int4_dequantize", broken)
    assert quantized.one_pass_dequantize_usable(torch.device("cpu"), torch.float16) is False
    assert quantized.one_pass_dequantize_usable(torch.device("cpu"), torch.float16) is False  # asked once
    assert "no one-pass int4 dequantize on cpu" in caplog.text and caplog.text.count("PassManager") == 1

    def wrong(qweight, scale, mid, group):
        return torch.zeros(qweight.shape[0], 2 * qweight.shape[1], dtype=scale.dtype)

    monkeypatch.setattr(triton_dequant, "int4_dequantize", wrong)
    assert quantized.one_pass_dequantize_usable(torch.device("cpu"), torch.bfloat16) is False
    assert "differs from torch's; not using it" in caplog.text


def test_the_cpu_keeps_torchs_formula(monkeypatch):
    def refuse(*args):
        raise AssertionError("the one-pass kernel is for CUDA")

    monkeypatch.setattr(triton_dequant, "int4_dequantize", refuse)
    monkeypatch.setattr(quantized, "one_pass_dequantize_usable", refuse)
    layer = quantized.Int4Linear.from_weight(torch.randn(64, 256) / 16)
    assert layer.options.one_pass_dequantize == ("cuda",)
    x = torch.randn(40, 256, dtype=torch.bfloat16)
    assert torch.equal(layer._dequantized(torch.bfloat16), layer.torch_dequantized(torch.bfloat16))
    assert layer(x).shape == (40, 64)
