"""The Triton int8 and int4 kernels (dictation/asr/nn/kernels/triton_gemv.py), run on the CPU in Triton's interpreter.

On a GPU the same kernel is compiled instead (test_fast_paths_cuda.py checks it there, and
quantized.cuda_int8_path / cuda_int4_path only use them after their probes). The interpreter needs
TRITON_INTERPRET=1 before the kernel is built, so the kernel runs in a child process that reports its errors as JSON.
"""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from dictation.asr.nn import quant_format, quant_paths, quantized
from dictation.asr.nn.kernels import triton_gemv
from dictation.asr.nn.options import ModelOptions
from tests.asr.interpreter import run_interpreted

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from dictation.asr.nn import quant_format
    from dictation.asr.nn import quantized
    from dictation.asr.nn.kernels import triton_gemv
    from dictation.asr.nn.quantized import Int4Linear, Int8Linear

    DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    # (rows, out, in), each in every dtype and block size. The interpreter runs a layer's programs one
    # after another, each the same code, so what a shape adds is its masks and loop steps; a larger
    # layer only repeats them (the 1.7B model's layers: on a GPU, test_fast_paths_cuda.py).
    SHAPES = [
        # the tiny checkpoint's (and its 2048-output layers' masks): out a multiple of every BLOCK_N,
        # in under every BLOCK_K
        (1, 128, 64),
        (2, 64, 2048),  # 1.7B's in-features (its q/k/v: 4096 x 2048): a multiple of every BLOCK_K, 2 to 16 steps
        (3, 100, 96),  # out off every BLOCK_N but 4, in under every BLOCK_K: both masks at once
        (4, 40, 1000),  # MAX_ROWS rows; several steps, the last one partial (BLOCK_K up to 512)
    ]
    gen = torch.Generator().manual_seed(7)
    report = {"errors": [], "probe": {}, "configs": None}
    for rows, out_f, in_f in SHAPES:
        layer = Int8Linear.from_weight(torch.randn(out_f, in_f, generator=gen) / 16)
        x32 = torch.randn(rows, in_f, generator=gen)
        for name, dtype in DTYPES.items():
            x = x32.to(dtype)
            reference = x.float() @ layer.dequantize().T  # the exact product, float32
            for block in triton_gemv.CONFIGS:
                got = triton_gemv.int8_matmul(x, layer.weight, layer.weight_scale, block=block)
                err = float((got.float() - reference).abs().max() / reference.abs().max())
                report["errors"].append([name, rows, out_f, in_f, list(block), got.dtype == dtype, err])
    # int4 (rows, out, in, group): every block size in bf16 (the GPU's dtype), the others at the
    # interpreter's block (the dtype only changes the loads' and the store's casts)
    INT4_SHAPES = [
        (1, 64, 256, 128),  # out a multiple of every BLOCK_N, in at most every BLOCK_K
        (2, 40, 96, 32),  # out off BLOCK_N 16 to 64, in under every BLOCK_K, the smallest group
        (3, 24, 512, 256),  # the largest group: one to eight groups a step (some masked), one or two steps
        (4, 20, 320, 64),  # MAX_ROWS rows, the last step partial
        (1, 24, 2048, 128),  # 1.7B's in-features and group: one to eight steps
    ]
    report["int4"] = []
    for rows, out_f, in_f, group in INT4_SHAPES:
        w = torch.randn(out_f, in_f, generator=gen) / 16
        w[0, :group] = 0.5  # a constant group (scale 1)
        layer = Int4Linear.from_weight(w, group_size=group)
        x32 = torch.randn(rows, in_f, generator=gen)
        for name, dtype in DTYPES.items():
            x = x32.to(dtype)
            reference = x.float() @ layer.dequantize().T
            blocks = triton_gemv.INT4_CONFIGS if name == "bf16" else triton_gemv.INT4_CONFIGS[1:2]
            for block in blocks:
                got = triton_gemv.int4_matmul(x, layer.qweight, layer.scales, layer.zeros, block=block)
                err = float((got.float() - reference).abs().max() / reference.abs().max())
                report["int4"].append([name, rows, out_f, in_f, group, list(block), got.dtype == dtype, err])
    for kind in ("int8", "int4"):  # the probe quantized.py runs before it uses the kernel
        for name, dtype in DTYPES.items():
            report["probe"][f"{kind} {name}"] = quantized._probe(kind, torch.device("cpu"), dtype, path="triton")
    # the autotuned wrappers (they cannot run here)
    report["configs"] = [len(triton_gemv._kernel().configs), len(triton_gemv._int4_kernel().configs)]
    print(json.dumps(report))
    """
)

# Relative to max |reference|: the result is rounded once to the output dtype (fp32 sums in another order).
TOLERANCE = {"fp32": 1e-5, "bf16": 8e-3, "fp16": 1e-3}


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT)


def test_the_kernel_matches_the_exact_product_for_every_block_size_and_dtype(interpreted):
    cases = interpreted["errors"]
    assert len(cases) == 3 * 4 * len(triton_gemv.CONFIGS)
    for dtype, rows, out_f, in_f, block, same_dtype, err in cases:
        assert same_dtype, f"{dtype} {rows}x{in_f} -> {out_f}: result not in the input dtype"
        assert err <= TOLERANCE[dtype], f"{dtype} {rows}x{in_f} -> {out_f}, block {block}: error {err:.2e}"


def test_the_int4_kernel_matches_the_exact_product_for_every_block_size_group_and_dtype(interpreted):
    cases = interpreted["int4"]
    assert len(cases) == 5 * (len(triton_gemv.INT4_CONFIGS) + 2)
    assert {case[4] for case in cases} == {32, 64, 128, 256}
    for dtype, rows, out_f, in_f, group, block, same_dtype, err in cases:
        assert same_dtype, f"{dtype} {rows}x{in_f} -> {out_f}: result not in the input dtype"
        where = f"{dtype} {rows}x{in_f} -> {out_f}, group {group}, block {block}"
        assert err <= TOLERANCE[dtype], f"{where}: error {err:.2e}"


def test_the_probe_accepts_them_and_autotune_gets_every_block_size(interpreted):
    assert interpreted["probe"] == {f"{k} {d}": True for k in ("int8", "int4") for d in ("fp32", "bf16", "fp16")}
    assert interpreted["configs"] == [len(triton_gemv.CONFIGS), len(triton_gemv.INT4_CONFIGS)]


def test_int4_block_sizes_hold_whole_groups():
    """The kernel sums each group before scaling it: BLOCK_K must be a multiple of every group size."""
    for _, block_k, _ in triton_gemv.INT4_CONFIGS:
        assert block_k % max(quant_format.GROUP_SIZES) == 0


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


def compile_int4_for(capability: int, dtype: str, block: tuple[int, int, int], group: int, aligned: bool):
    """The int4 kernel compiled ahead of time, as :func:`compile_for` does the int8 one."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    block_n, block_k, warps = block
    pointers = {"x_ptr": f"*{dtype}", "w_ptr": "*i32", "scale_ptr": "*fp32", "zero_ptr": "*fp32", "y_ptr": f"*{dtype}"}
    ints = dict.fromkeys(("N", "KW", "stride_x", "stride_w", "stride_s", "stride_y"), "i32")
    signature = {**pointers, **ints, "GROUP": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers) + len(ints))} if aligned else None
    constexprs = {"GROUP": group, "BLOCK_N": block_n, "BLOCK_K": block_k}
    source = ASTSource(fn=triton_gemv.raw_int4_kernel(), signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})


@pytest.mark.parametrize("capability", [80, 89, 90])
def test_the_int4_kernel_compiles_for_real_gpus_reads_16_byte_vectors_and_never_converts_integers(capability):
    """On aligned layers (the decoder's: K / 8 words a multiple of 16) each thread loads its weights
    as 16-byte vectors, and no nibble goes through an integer-to-float conversion (2 per byte would
    cap the kernel below the memory bandwidth on an H100: 16 conversions per clock per SM)."""
    cases = [("bf16", block, 128) for block in triton_gemv.INT4_CONFIGS]
    cases += [("fp16", triton_gemv.INT4_CONFIGS[1], 32), ("bf16", triton_gemv.INT4_CONFIGS[0], 256)]
    for dtype, block, group in cases:
        ptx = compile_int4_for(capability, dtype, block, group, aligned=True).asm["ptx"]
        block_n, block_k, warps = block
        words_per_thread = block_n * block_k // 8 // (32 * warps)  # of the weights, per step
        loads = re.findall(r"ld\.global(?:\.\w+)*", ptx)
        assert loads.count("ld.global.v4.b32") >= words_per_thread // 4, (dtype, block, group, loads)
        assert not re.findall(r"cvt\.rn\.f32\.[su](?:8|16|32)", ptx), (dtype, block)
    assert compile_int4_for(capability, "bf16", triton_gemv.INT4_CONFIGS[1], 64, aligned=False).asm.get("cubin")


def test_misfit_inputs_are_refused_with_their_shapes():
    w = torch.zeros(8, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"x \(1, 16\), weight \(8, 32\)"):
        triton_gemv.int8_matmul(torch.zeros(1, 16), w, torch.ones(8))
    with pytest.raises(ValueError, match=r"scale \(4,\)"):
        triton_gemv.int8_matmul(torch.zeros(1, 32), w, torch.ones(4))
    with pytest.raises(ValueError, match="do not fit"):
        triton_gemv.int8_matmul(torch.zeros(1, 64)[:, ::2], w, torch.ones(8))  # not contiguous along K
    q, s = torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8, 1)
    with pytest.raises(ValueError, match=r"x \(1, 64\), qweight \(8, 64\) torch.uint8, scales \(8, 1\)"):
        triton_gemv.int4_matmul(torch.zeros(1, 64), q, s, s)  # qweight holds 128 inputs
    for scales in (torch.ones(8, 3), torch.ones(8, 8), torch.ones(4, 1)):  # 42.7, 16 per group, rows
        with pytest.raises(ValueError, match="do not fit"):
            triton_gemv.int4_matmul(torch.zeros(1, 128), q, scales, scales)
    with pytest.raises(ValueError, match="do not fit"):
        triton_gemv.int4_matmul(torch.zeros(1, 128), q.view(torch.int8), s, s)
    with pytest.raises(ValueError, match="do not fit"):  # rows not on 4-byte boundaries
        triton_gemv.int4_matmul(torch.zeros(1, 128), torch.zeros(8, 66, dtype=torch.uint8)[:, 2:], s, s)


def test_a_triton_kernel_that_answers_wrongly_is_left_out_not_fatal(monkeypatch, caplog):
    """Ours is one candidate among three: a wrong answer logs and falls back (torch's own raises)."""
    monkeypatch.setattr(quantized.Int8Linear, "_triton_kernel", lambda self, x, dtype: self._dequantize_matmul(x) * 1.5)
    assert quantized._probe("int8", torch.device("cpu"), torch.float32, path="triton") is False
    assert "(Triton)" in caplog.text and "not using it" in caplog.text
    monkeypatch.setattr(quantized.Int8Linear, "_torch_kernel", lambda self, x, dtype: self._dequantize_matmul(x) * 1.5)
    with pytest.raises(RuntimeError, match="gives wrong results"):
        quantized._probe("int8", torch.device("cpu"), torch.float32)


def test_a_triton_kernel_that_fails_to_run_is_left_out(monkeypatch, caplog):
    caplog.set_level("INFO", logger="dictation.asr.nn.quant_paths")

    def broken(self, x, dtype):
        raise RuntimeError("PassManager::run failed")  # a compile error on some GPU

    monkeypatch.setattr(quantized.Int8Linear, "_triton_kernel", broken)
    assert quantized._probe("int8", torch.device("cpu"), torch.float32, path="triton") is False
    assert "Triton int8 kernel unavailable" in caplog.text


class _Paths:
    """Stand-ins for what cuda_int8_path / cuda_int4_path ask of the GPU: which candidates run right,
    their times."""

    def __init__(self, monkeypatch, times: dict[str, float], torch_ok=True, triton_ok=True, triton_there=True):
        self.timed: list[str] = []
        monkeypatch.setattr(quant_paths, "_CUDA_INT8", {})
        monkeypatch.setattr(quant_paths, "_CUDA_INT4", {})
        monkeypatch.setattr(quant_paths, "kernel_available", lambda layer_type, device, dtype: torch_ok)
        monkeypatch.setattr(triton_gemv, "available", lambda: triton_there)
        monkeypatch.setattr(quant_paths, "probe", lambda layer_type, device, dtype, path="torch": triton_ok)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

        def timing(layer_type, path, device, dtype):
            self.timed.append(path)
            return times[path]

        monkeypatch.setattr(quant_paths, "time_kernel", timing)


CUDA = torch.device("cuda")


PATH_OF = {"int8": quantized.cuda_int8_path, "int4": quantized.cuda_int4_path}


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_fastest_path_that_answers_right_is_chosen_once(monkeypatch, caplog, kind):
    caplog.set_level("INFO", logger="dictation.asr.nn.quant_paths")
    path_of = PATH_OF[kind]
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.052, "dequantize": 0.020})
    assert path_of(CUDA, torch.bfloat16) == "triton"
    assert path_of(torch.device("cuda", 0), torch.bfloat16) == "triton"
    assert sorted(paths.timed) == ["dequantize", "torch", "triton"]  # once per (GPU, dtype)
    assert f"{kind} on cuda:0" in caplog.text and "triton 11.0 us" in caplog.text and "using triton" in caplog.text
    other = PATH_OF["int4" if kind == "int8" else "int8"]
    assert other(CUDA, torch.bfloat16) == "triton" and len(paths.timed) == 6  # each kind decides for itself

    paths = _Paths(monkeypatch, {"triton": 0.031, "torch": 0.052, "dequantize": 0.020})
    assert path_of(CUDA, torch.bfloat16) == "dequantize"
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.052, "dequantize": 0.020}, triton_ok=False)
    assert path_of(CUDA, torch.bfloat16) == "dequantize" and "triton" not in paths.timed
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.009, "dequantize": 0.020}, triton_there=False)
    assert path_of(CUDA, torch.float16) == "torch"
    paths = _Paths(monkeypatch, {}, torch_ok=False, triton_there=False)
    assert path_of(CUDA, torch.float16) == "dequantize" and paths.timed == []  # nothing to time


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_path_can_be_forced(monkeypatch, kind):
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.052, "dequantize": 0.020})
    forced = ModelOptions(**{f"cuda_{kind}_path": "torch"})
    assert PATH_OF[kind](CUDA, torch.bfloat16, forced) == "torch" and paths.timed == []
    paths = _Paths(monkeypatch, {}, torch_ok=False)
    assert PATH_OF[kind](CUDA, torch.bfloat16, forced) == "dequantize"  # forced but unusable
    paths = _Paths(monkeypatch, {"triton": 0.011, "torch": 0.052, "dequantize": 0.020})
    assert PATH_OF[kind](CUDA, torch.bfloat16) == "triton"  # another model's choice, in the same process


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize(
    ("path", "rows", "kernel"),
    [("triton", 1, True), ("triton", triton_gemv.MAX_ROWS, True), ("triton", triton_gemv.MAX_ROWS + 1, False),
     ("torch", 1, True), ("torch", 32, True), ("torch", 33, False), ("dequantize", 1, False)],
)  # fmt: skip
def test_a_layer_on_cuda_takes_the_chosen_path(monkeypatch, kind, path, rows, kernel):
    from types import SimpleNamespace

    monkeypatch.setattr(quantized, f"cuda_{kind}_path", lambda device, dtype, options: path)
    w = torch.randn(64, 128)
    layer = quantized.Int8Linear.from_weight(w) if kind == "int8" else quantized.Int4Linear.from_weight(w)
    x = SimpleNamespace(device=CUDA, dtype=torch.bfloat16)
    assert layer._plan(x, rows) == (torch.bfloat16, kernel)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_layer_calls_the_kernel_of_its_path(monkeypatch, kind):
    """What ``_plan`` allows, ``_kernel`` runs: ours on "triton", torch's otherwise (stand-ins record
    which; the layer itself cannot reach CUDA here)."""
    from types import SimpleNamespace

    w = torch.randn(64, 128)
    layer = quantized.Int8Linear.from_weight(w) if kind == "int8" else quantized.Int4Linear.from_weight(w)
    called = []
    monkeypatch.setattr(type(layer), "_triton_kernel", lambda self, x, dtype: called.append("triton"))
    monkeypatch.setattr(type(layer), "_torch_kernel", lambda self, x, dtype: called.append("torch"))
    for path in ("triton", "torch"):
        monkeypatch.setattr(quantized, f"cuda_{kind}_path", lambda device, dtype, options, p=path: p)
        layer._kernel(SimpleNamespace(device=CUDA), torch.bfloat16)
    layer._kernel(torch.zeros(1, 128), torch.float32)  # not CUDA: torch's kernel
    assert called == ["triton", "torch", "torch"]
