"""Which kernel the int8 / int4 layers run on: each candidate probed against dequantize + matmul, and
where several work, timed, once per process and machine.

These are facts about the machine (does torch's kernel run here and answer right, which CUDA path is
fastest on this GPU, does the bf16 kernel beat float32 on this CPU), kept for the process in the
caches below; the choices a caller makes (kernels at all, a forced CUDA path, bf16 on the CPU) come
in as arguments. The layers themselves, and how each candidate computes: ``quantized.py``, which
passes its layer classes in (``layer_type``: ``Int8Linear`` or ``Int4Linear``), so that this module
needs nothing of it.

int8 and int4 on CUDA have three candidates each (:func:`cuda_path`): torch's kernel (int8:
``_weight_int8pack_mm``, torch 2.9 and later; int4: tinygemm, bf16 only, on a packed copy of the
weights), our Triton kernel (kernels/triton_gemv.py; int4's reads the stored layout, so no packed copy)
and dequantize + matmul. Each that runs and answers right is timed once per process and GPU on a
decoder-sized layer, as GPU time in a CUDA graph over copies that spill the L2 cache
(:func:`gpu_time_ms`, what a decode step sees), and the fastest decodes: the choice is made on the GPU
that runs it. ``benchmarks/bench_gemv.py`` times every candidate on every layer shape.
"""

from __future__ import annotations

import functools
import logging

import torch

from dictation.asr.nn.graphs import gpu_time_ms, l2_copies

log = logging.getLogger(__name__)

PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}  # x max |reference|
CUDA_PATHS = ("triton", "torch", "dequantize")
# The layer the CUDA candidates are timed on: one row through a [4096, 2048] weight (1.7B's q/k/v).
CUDA_TIMING_SHAPE = (4096, 2048)
CPU_DECODE_TIMING_SHAPE = (3072, 1024)  # [out, in]: the 0.6B's gate/up rows, one row through it

# What was measured, once per process (facts about the machine, not choices):
_KERNEL_OK: dict[tuple, bool] = {}  # (kind, device type, index, dtype) -> torch's kernel runs and is right
_CPU_DECODE_BF16: dict[str, bool] = {}  # kind -> whether the bf16 kernel won on this CPU
_ONE_PASS_OK: dict[tuple, bool] = {}  # (device type, index, dtype) -> the one-pass int4 dequantize is usable
_CUDA_INT8: dict[tuple, str] = {}  # (GPU, dtype, forced, kernels on) -> the int8 path
_CUDA_INT4: dict[tuple, str] = {}


# --- the CPU ----------------------------------------------------------------------------------------------


@functools.cache
def cpu_has_bf16() -> bool:
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:
        return False


def cpu_computes_in_bf16(forced: bool | None = None) -> bool:
    """Whether quantized layers on the CPU compute in bf16 whatever the activation dtype (the result is
    cast back). By default where the CPU has bf16 dot-product instructions (AVX512-BF16, AMX): there
    torch's bf16 kernels beat every float32 path by 5-25x, and bf16 rounding of the activations is
    ~10x smaller than the weights' quantization error. ``forced`` (True / False) overrides."""
    return cpu_has_bf16() if forced is None else forced


def cpu_decodes_in_bf16(layer_type: type, forced: bool | None = None) -> bool:
    """Whether ``layer_type``'s layers on a CPU that computes in float32 (:func:`cpu_computes_in_bf16`
    False) still run decode-sized calls (up to the kernel's row limit) through torch's bf16 kernel, the
    activations rounded to bf16 and the result widened back. torch's float32 int8/int4 kernels are
    scalar loops: on an AVX2 CPU without bf16 instructions (torch 2.13, 2 threads, a [3072, 1024]
    layer, one row) int8's float32 kernel took 3.1 ms, dequantize + matmul 2.1 ms and the bf16 kernel
    0.29 ms; int4's 3.0 against 0.26 ms. bf16 rounding moved the int8 layer's output by 0.28 % (its
    weights' rounding: 0.74 %). Decided by timing, once per process and kind, on that layer;
    ``forced = False`` turns it off (float32 everywhere), as it does the rest."""
    if forced is not None:
        return forced
    if cpu_has_bf16():
        return True
    return bf16_decode_wins(layer_type)


def bf16_decode_wins(layer_type: type) -> bool:
    kind = layer_type.kind
    if kind not in _CPU_DECODE_BF16:
        _CPU_DECODE_BF16[kind] = _time_bf16_decode(layer_type)
    return _CPU_DECODE_BF16[kind]


def _time_bf16_decode(layer_type: type) -> bool:
    import time

    kind = layer_type.kind
    cpu = torch.device("cpu")
    if not kernel_available(layer_type, cpu, torch.bfloat16):
        return False
    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode(False), torch.no_grad():
        # Random stored values rather than a quantized float weight: no float-sized temporaries at the
        # first decode step, whose memory would count in the transcription's peak.
        out_f, in_f = CPU_DECODE_TIMING_SHAPE
        layer = layer_type(in_f, out_f)
        stored = layer.weight if kind == "int8" else layer.qweight
        stored.copy_(torch.randint(-127 if kind == "int8" else 0, 128, stored.shape, generator=gen, dtype=stored.dtype))
        (layer.weight_scale if kind == "int8" else layer.scales).uniform_(1e-3, 2e-3, generator=gen)
        x = torch.randn(1, in_f, generator=gen)
        fits32 = layer._kernel_fits(cpu, torch.float32) and kernel_available(layer_type, cpu, torch.float32)
        candidates = {
            "bf16 kernel": lambda: layer._torch_kernel(x.bfloat16(), torch.bfloat16).float(),
            "float32": (
                (lambda: layer._torch_kernel(x, torch.float32)) if fits32 else (lambda: layer._dequantize_matmul(x))
            ),
        }
        best = {}
        for name, run in candidates.items():
            run()  # the first call builds the kernel layout
            times = []
            for _ in range(5):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            best[name] = min(times)
    wins = best["bf16 kernel"] < best["float32"]
    log.info(
        "%s decode on this CPU: bf16 kernel %.3f ms, float32 %.3f ms per row; decoding in %s",
        kind,
        best["bf16 kernel"] * 1e3,
        best["float32"] * 1e3,
        "bf16" if wins else "float32",
    )
    return wins


# --- probes -----------------------------------------------------------------------------------------------


def kernel_available(layer_type: type, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's kernel for ``layer_type`` runs on (device, dtype) and agrees with dequantize +
    matmul, checked once on a small problem. A kernel that raises is reported missing; one that answers
    wrongly raises."""
    key = (layer_type.kind, device.type, device.index, dtype)
    if key not in _KERNEL_OK:
        _KERNEL_OK[key] = probe(layer_type, device, dtype)
    return _KERNEL_OK[key]


def probe(layer_type: type, device: torch.device, dtype: torch.dtype, path: str = "torch") -> bool:
    """``path``: which kernel ("torch": torch's; "triton": ours, rows <= its MAX_ROWS)."""
    kind = layer_type.kind
    gen = torch.Generator().manual_seed(1234)
    weight = torch.randn(64, 256, generator=gen) / 16
    x = torch.randn(5 if path == "torch" else 3, 256, generator=gen)
    module = layer_type.from_weight(weight) if kind == "int8" else layer_type.from_weight(weight, group_size=128)
    module = module.to(device)
    run = module._triton_kernel if path == "triton" else module._torch_kernel
    with torch.inference_mode(False), torch.no_grad():
        xs = x.to(device=device, dtype=dtype)
        reference = xs.float() @ module.dequantize().T
        try:
            got = torch.cat([run(xs[:1], dtype), run(xs, dtype)])
        except Exception as exc:  # missing op, unsupported dtype or GPU, a Triton that cannot compile
            what = f"Triton {kind}" if path == "triton" else kind
            log.info("%s kernel unavailable on %s for %s (%s); using dequantize + matmul", what, device, dtype, exc)
            return False
        expected = torch.cat([reference[:1], reference])
        err = float((got.float() - expected).abs().max())
        bound = PROBE_TOLERANCE.get(dtype, 2e-2) * float(expected.abs().max())
    if not err <= bound:  # also catches NaN
        message = (
            f"the {kind} weight-only kernel{' (Triton)' if path == 'triton' else ''} on {device} ({dtype}) gives "
            f"wrong results (max error {err:.3g}, allowed {bound:.3g})"
        )
        if path == "triton":  # ours, and one of several candidates: leave it out rather than fail
            log.warning("%s; not using it", message)
            return False
        raise RuntimeError(f"{message}; run with ModelOptions(quant_kernels=False) to avoid it")
    return True


def one_pass_dequantize_usable(layer_type: type, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the one-pass int4 dequantize (kernels/triton_dequant.py) runs on (device, dtype) and gives
    ``Int4Linear.torch_dequantized``'s bits (``layer_type``: Int4Linear): checked once, on a layer with
    sizes off the kernel's block multiples; False (one log line) where it does not."""
    key = (device.type, device.index, dtype)
    if key not in _ONE_PASS_OK:
        _ONE_PASS_OK[key] = _check_one_pass(layer_type, device, dtype)
    return _ONE_PASS_OK[key]


def _check_one_pass(layer_type: type, device: torch.device, dtype: torch.dtype) -> bool:
    from dictation.asr.nn.kernels import triton_dequant

    gen = torch.Generator().manual_seed(4)
    with torch.inference_mode(False), torch.no_grad():
        layer = layer_type.from_weight(torch.randn(24, 2304, generator=gen) / 16, group_size=64).to(device)
        want = layer.torch_dequantized(dtype)
        try:
            scale, mid = layer._half_scales(dtype)
            got = triton_dequant.int4_dequantize(layer.qweight, scale, mid, layer.group_size)
        except Exception as exc:  # no Triton, a Triton too old for this code, a GPU it cannot compile for
            log.info("no one-pass int4 dequantize on %s for %s (%s); using torch's", device, dtype, exc)
            return False
        if not torch.equal(got, want):
            log.warning("the one-pass int4 dequantize on %s (%s) differs from torch's; not using it", device, dtype)
            return False
    return True


# --- CUDA -------------------------------------------------------------------------------------------------


def cuda_path(
    layer_type: type, device: torch.device, dtype: torch.dtype, forced: str | None = None, use_kernels: bool = True
) -> str:
    """How ``layer_type``'s layers on ``device`` (CUDA) multiply one to a few rows in ``dtype``:
    "triton" (ours, on the stored layout), "torch" (int8: ``_weight_int8pack_mm``; int4: tinygemm, bf16
    only, on a kernel layout built beside the weights) or "dequantize" (see the module docstring).
    ``forced``: that path where it is usable, else "dequantize"; ``use_kernels`` False: "dequantize".
    Decided at the first call per (GPU, dtype, forced, use_kernels), which the warm-up makes (it syncs
    the GPU, so it must not happen inside a graph capture)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    chosen = _CUDA_INT8 if layer_type.kind == "int8" else _CUDA_INT4
    key = (index, dtype, forced, use_kernels)
    if key not in chosen:
        chosen[key] = _choose_cuda(layer_type, torch.device("cuda", index), dtype, forced, use_kernels)
    return chosen[key]


def _choose_cuda(
    layer_type: type, device: torch.device, dtype: torch.dtype, forced: str | None, use_kernels: bool
) -> str:
    from dictation.asr.nn.kernels import triton_gemv

    kind = layer_type.kind
    usable = ["dequantize"]
    if use_kernels and kernel_available(layer_type, device, dtype):
        usable.append("torch")
    if use_kernels and triton_gemv.available() and probe(layer_type, device, dtype, path="triton"):
        usable.append("triton")
    if forced is not None:
        chosen = forced if forced in usable else "dequantize"
        log.info("%s on %s (%s): %s (forced: %s)", kind, device, dtype, chosen, forced)
        return chosen
    if len(usable) == 1:
        return usable[0]
    times = {path: time_kernel(layer_type, path, device, dtype) for path in usable}
    chosen = min(times, key=times.get)
    log.info(
        "%s on %s (%s), one row through %s: %s; using %s",
        kind,
        device,
        dtype,
        "x".join(map(str, CUDA_TIMING_SHAPE)),
        ", ".join(f"{p} {t * 1e3:.1f} us" for p, t in times.items()),
        chosen,
    )
    return chosen


def time_kernel(layer_type: type, path: str, device: torch.device, dtype: torch.dtype, repeats: int = 50) -> float:
    """Milliseconds per call of one path of ``layer_type`` on a decoder-sized layer (int4: group size
    ``DEFAULT_GROUP_SIZE``), as GPU time in a CUDA graph, after warm-up calls that also let
    triton.autotune pick its blocks for this shape."""
    out_f, in_f = CUDA_TIMING_SHAPE
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out_f, in_f, generator=gen) / 32
    layer = layer_type.from_weight(weight)
    layers = l2_copies(layer.to(device), device)
    x = torch.randn(1, in_f, generator=gen).to(device, dtype)
    if path == "dequantize":
        calls = [functools.partial(m._dequantize_matmul, x) for m in layers]
    else:
        calls = [functools.partial(m._triton_kernel if path == "triton" else m._torch_kernel, x, dtype) for m in layers]
    return gpu_time_ms(calls, device, repeats)
