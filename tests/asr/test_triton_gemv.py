"""The Triton int8 kernel (dictation/asr/triton_gemv.py), run on the CPU in Triton's interpreter.

On a GPU the same kernel is compiled instead (test_fast_paths_cuda.py checks it there, and
quant.cuda_int8_path only uses it after its probe). The interpreter needs TRITON_INTERPRET=1 before
the kernel is built, so the kernel runs in a child process that reports its errors as JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from dictation.asr import quant, triton_gemv

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from dictation.asr import quant, triton_gemv
    from dictation.asr.quant import Int8Linear

    DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    # (rows, out, in): the tiny checkpoint's layers, sizes off every block multiple, 1.7B's q/k/v
    SHAPES = [(1, 2048, 64), (2, 64, 2048), (1, 128, 64), (3, 100, 96), (4, 40, 1000), (1, 4096, 2048)]
    gen = torch.Generator().manual_seed(7)
    report = {"errors": [], "probe": {}, "configs": None}
    for rows, out_f, in_f in SHAPES:
        layer = Int8Linear.from_weight(torch.randn(out_f, in_f, generator=gen) / 16)
        x32 = torch.randn(rows, in_f, generator=gen)
        blocks = triton_gemv.CONFIGS if out_f * in_f <= 1 << 17 else triton_gemv.CONFIGS[:1]
        for name, dtype in DTYPES.items():
            x = x32.to(dtype)
            reference = x.float() @ layer.dequantize().T  # the exact product, float32
            for block in blocks:
                got = triton_gemv.int8_matmul(x, layer.weight, layer.weight_scale, block=block)
                err = float((got.float() - reference).abs().max() / reference.abs().max())
                report["errors"].append([name, rows, out_f, in_f, list(block), got.dtype == dtype, err])
    for name, dtype in DTYPES.items():  # the probe quant.py runs before it uses the kernel
        report["probe"][name] = quant._probe("int8", torch.device("cpu"), dtype, path="triton")
    report["configs"] = len(triton_gemv._kernel().configs)  # the autotuned wrapper (it cannot run here)
    print(json.dumps(report))
    """
)

# Relative to max |reference|: the result is rounded once to the output dtype (fp32 sums in another order).
TOLERANCE = {"fp32": 1e-5, "bf16": 8e-3, "fp16": 1e-3}


@pytest.fixture(scope="module")
def interpreted():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_kernel_matches_the_exact_product_for_every_block_size_and_dtype(interpreted):
    cases = interpreted["errors"]
    assert len(cases) == 3 * (5 * len(triton_gemv.CONFIGS) + 1)
    for dtype, rows, out_f, in_f, block, same_dtype, err in cases:
        assert same_dtype, f"{dtype} {rows}x{in_f} -> {out_f}: result not in the input dtype"
        assert err <= TOLERANCE[dtype], f"{dtype} {rows}x{in_f} -> {out_f}, block {block}: error {err:.2e}"


def test_the_probe_accepts_it_and_autotune_gets_every_block_size(interpreted):
    assert interpreted["probe"] == {"fp32": True, "bf16": True, "fp16": True}
    assert interpreted["configs"] == len(triton_gemv.CONFIGS)


def compile_for(capability: int, dtype: str, block: tuple[int, int, int], aligned: bool):
    """The kernel compiled ahead of time by Triton's real compiler (to PTX and a cubin with the ptxas
    Triton ships), no GPU needed. ``aligned``: every pointer, size and stride divisible by 16, as the
    decoder's layers are; at run time Triton's JIT sees that and specializes the same way."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    block_n, block_k, warps = block
    pointers = {"x_ptr": f"*{dtype}", "w_ptr": "*i8", "scale_ptr": "*fp32", "y_ptr": f"*{dtype}"}
    ints = dict.fromkeys(("N", "K", "stride_x", "stride_w", "stride_y"), "i32")
    signature = {**pointers, **ints, "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers) + len(ints))} if aligned else None
    constexprs = {"BLOCK_N": block_n, "BLOCK_K": block_k}
    source = ASTSource(fn=triton_gemv.raw_kernel(), signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})


@pytest.mark.parametrize("capability", [80, 89, 90])  # A100 / RTX 30 (86 is the same code), RTX 40, H100
def test_the_kernel_compiles_for_real_gpus_and_reads_weights_in_vectors(capability):
    """The interpreter accepts more than the compiler does; and one-byte loads would make the kernel
    slow however it is tuned. On aligned layers every global load is a vector or a word, none a byte."""
    for dtype in ("bf16", "fp16"):
        for block in triton_gemv.CONFIGS:
            kernel = compile_for(capability, dtype, block, aligned=True)
            assert kernel.asm.get("cubin"), f"no cubin for sm_{capability}"
            loads = re.findall(r"ld\.global(?:\.\w+)*", kernel.asm["ptx"])
            assert loads and not [op for op in loads if op.endswith(".b8")], (dtype, block, loads)
            assert any(".v4." in op for op in loads), (dtype, block, loads)
    assert compile_for(capability, "bf16", triton_gemv.CONFIGS[0], aligned=False).asm.get("cubin")  # odd sizes


def test_misfit_inputs_are_refused_with_their_shapes():
    w = torch.zeros(8, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"x \(1, 16\), weight \(8, 32\)"):
        triton_gemv.int8_matmul(torch.zeros(1, 16), w, torch.ones(8))
    with pytest.raises(ValueError, match=r"scale \(4,\)"):
        triton_gemv.int8_matmul(torch.zeros(1, 32), w, torch.ones(4))
    with pytest.raises(ValueError, match="do not fit"):
        triton_gemv.int8_matmul(torch.zeros(1, 64)[:, ::2], w, torch.ones(8))  # not contiguous along K


def test_a_triton_kernel_that_answers_wrongly_is_left_out_not_fatal(monkeypatch, caplog):
    """Ours is one candidate among three: a wrong answer logs and falls back (torch's own raises)."""
    monkeypatch.setattr(quant.Int8Linear, "_triton_kernel", lambda self, x, dtype: self._fallback(x) * 1.5)
    assert quant._probe("int8", torch.device("cpu"), torch.float32, path="triton") is False
    assert "(Triton)" in caplog.text and "not using it" in caplog.text
    monkeypatch.setattr(quant.Int8Linear, "_torch_kernel", lambda self, x, dtype: self._fallback(x) * 1.5)
    with pytest.raises(RuntimeError, match="gives wrong results"):
        quant._probe("int8", torch.device("cpu"), torch.float32)


def test_a_triton_kernel_that_fails_to_run_is_left_out(monkeypatch, caplog):
    caplog.set_level("INFO", logger="dictation.asr.quant")

    def broken(self, x, dtype):
        raise RuntimeError("PassManager::run failed")  # a compile error on some GPU

    monkeypatch.setattr(quant.Int8Linear, "_triton_kernel", broken)
    assert quant._probe("int8", torch.device("cpu"), torch.float32, path="triton") is False
    assert "Triton int8 kernel unavailable" in caplog.text


class _Paths:
    """Stand-ins for what cuda_int8_path asks of the GPU: which candidates run right, their times."""

    def __init__(self, monkeypatch, times: dict[str, float], torch_ok=True, triton_ok=True, triton_there=True):
        self.timed: list[str] = []
        monkeypatch.setattr(quant, "_CUDA_INT8", {})
        monkeypatch.setattr(quant, "_kernel_available", lambda kind, device, dtype: torch_ok)
        monkeypatch.setattr(triton_gemv, "available", lambda: triton_there)
        monkeypatch.setattr(quant, "_probe", lambda kind, device, dtype, path="torch": triton_ok)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

        def timing(path, device, dtype):
            self.timed.append(path)
            return times[path]

        monkeypatch.setattr(quant, "_time_int8", timing)


CUDA = torch.device("cuda")


def test_the_fastest_int8_path_that_answers_right_is_chosen_once(monkeypatch, caplog):
    caplog.set_level("INFO", logger="dictation.asr.quant")
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.052, "dequantize": 0.020})
    assert quant.cuda_int8_path(CUDA, torch.bfloat16) == "triton"
    assert quant.cuda_int8_path(torch.device("cuda", 0), torch.bfloat16) == "triton"
    assert sorted(paths.timed) == ["dequantize", "torch", "triton"]  # once per (GPU, dtype)
    assert "triton 11.0 us" in caplog.text and "using triton" in caplog.text

    paths = _Paths(monkeypatch, {"triton": 0.031, "torch": 0.052, "dequantize": 0.020})
    assert quant.cuda_int8_path(CUDA, torch.bfloat16) == "dequantize"
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.052, "dequantize": 0.020}, triton_ok=False)
    assert quant.cuda_int8_path(CUDA, torch.bfloat16) == "dequantize" and "triton" not in paths.timed
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.009, "dequantize": 0.020}, triton_there=False)
    assert quant.cuda_int8_path(CUDA, torch.float16) == "torch"
    paths = _Paths(monkeypatch, {}, torch_ok=False, triton_there=False)
    assert quant.cuda_int8_path(CUDA, torch.float16) == "dequantize" and paths.timed == []  # nothing to time


def test_an_int8_path_can_be_forced(monkeypatch):
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.052, "dequantize": 0.020})
    monkeypatch.setattr(quant, "CUDA_INT8_PATH", "torch")
    assert quant.cuda_int8_path(CUDA, torch.bfloat16) == "torch" and paths.timed == []
    paths = _Paths(monkeypatch, {}, torch_ok=False)
    assert quant.cuda_int8_path(CUDA, torch.bfloat16) == "dequantize"  # forced but unusable


@pytest.mark.parametrize(
    ("path", "rows", "kernel"),
    [("triton", 1, True), ("triton", triton_gemv.MAX_ROWS, True), ("triton", triton_gemv.MAX_ROWS + 1, False),
     ("torch", 1, True), ("torch", 32, True), ("torch", 33, False), ("dequantize", 1, False)],
)  # fmt: skip
def test_an_int8_layer_on_cuda_takes_the_chosen_path(monkeypatch, path, rows, kernel):
    from types import SimpleNamespace

    monkeypatch.setattr(quant, "cuda_int8_path", lambda device, dtype: path)
    layer = quant.Int8Linear.from_weight(torch.randn(64, 128))
    x = SimpleNamespace(device=CUDA, dtype=torch.bfloat16)
    assert layer._plan(x, rows) == (torch.bfloat16, kernel)
