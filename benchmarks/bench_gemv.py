"""One-row matrix products through the decoder's layer shapes: bf16 against every int8 and int4 kernel.

What a decode step's matrix products cost, kernel by kernel, without the rest of the step: for each
layer shape of the model (fused q/k/v, o, fused gate/up, down, and the bf16 output head) and each
candidate (bf16 ``F.linear``; int8: our Triton kernel, torch's ``_weight_int8pack_mm``, dequantize +
matmul; int4: our Triton kernel, torch's tinygemm ``_weight_int4pack_mm``, dequantize + matmul) it
prints the GPU time of one call, the bytes that kernel reads, the bandwidth that makes and its share
of the GPU's peak. Times are GPU time in a CUDA graph (as the decode step runs) over enough copies of
each layer to spill the L2 cache, so the weights come from memory as they do in a real step
(``graphs.gpu_time_ms``, ``graphs.l2_copies``). Every result is checked against the float product.

    python benchmarks/bench_gemv.py                        # 1.7B shapes, about 20-30 s on an H100
    python benchmarks/bench_gemv.py --size 0.6B --group-size 64 --configs --json gemv.json
    python benchmarks/bench_gemv.py --size tiny --device cpu   # smoke run (wall-clock times; Triton only
                                                               # with TRITON_INTERPRET=1, its interpreter)

Below the table: per variant and path, the sum over one decoder layer, times the number of layers
plus the head: the matrix products of one decode step, and their speed-up over bf16.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere: import dictation from this checkout
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dictation.asr.nn import graphs, quant_format, quantized  # noqa: E402
from dictation.asr.nn.kernels import triton_gemv  # noqa: E402
from dictation.bench.checkpoints import SIZES, TEXT_COMMON  # noqa: E402
from dictation.bench.measure import gpu_bandwidth  # noqa: E402

PATHS = ("triton", "torch", "dequantize")
H100_BANDWIDTH = 3.35e12  # bytes/s, H100 SXM (HBM3): the reference where the GPU is not known


def layer_shapes(size: str) -> tuple[dict[str, tuple[int, int]], int]:
    """({name: (out_features, in_features)} of one decoder layer's fused products and the head,
    number of decoder layers) for a model size of the bench's random checkpoints (the real dimensions)."""
    text = {**TEXT_COMMON, **SIZES[size]["text"]}
    h, inter, hd = text["hidden_size"], text["intermediate_size"], text["head_dim"]
    q, kv = text["num_attention_heads"] * hd, text["num_key_value_heads"] * hd
    shapes = {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * inter, h), "down": (h, inter)}
    shapes["head"] = (text["vocab_size"], h)
    return shapes, text["num_hidden_layers"]


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _timer(device: torch.device, repeats: int):
    if device.type == "cuda":
        return lambda calls: graphs.gpu_time_ms(calls, device, repeats)

    def wall(calls) -> float:  # CPU: wall-clock, for smoke runs
        for call in calls:
            call()
        start = time.perf_counter()
        for i in range(repeats):
            calls[i % len(calls)]()
        return (time.perf_counter() - start) * 1e3 / repeats

    return wall


def _copies(layer, device: torch.device):
    return graphs.l2_copies(layer, device) if device.type == "cuda" else [layer]


def _candidates(kind: str, layer, x: torch.Tensor, device: torch.device, configs: bool):
    """(path, label, bytes read, function of a layer) for every kernel of ``kind`` that runs here."""
    dtype = x.dtype
    out: list[tuple[str, str, int, Any]] = []
    if kind == "int8":
        stored = _bytes(layer.weight) + _bytes(layer.weight_scale)
        torch_bytes = _bytes(layer.weight) + layer.out_features * x.element_size()
    else:
        stored = _bytes(layer.qweight) + _bytes(layer.scales) + _bytes(layer.zeros)
        # tinygemm: the packed copy (as many bytes as qweight) and scales-and-zeros in the activation dtype
        torch_bytes = _bytes(layer.qweight) + 2 * layer.scales.numel() * x.element_size()
    # dequantize + matmul: read the stored weights, write and read them again in the activation dtype
    dequant_bytes = stored + 2 * layer.out_features * layer.in_features * x.element_size()
    # on the CPU only in Triton's interpreter (TRITON_INTERPRET=1: the tests' smoke run)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    triton_ok = (device.type == "cuda" or interpreted) and triton_gemv.available()
    if triton_ok:
        out.append(("triton", "triton (autotuned)", stored, lambda m: functools.partial(m._triton_kernel, x, dtype)))
        if configs:
            kernel = triton_gemv.int8_matmul if kind == "int8" else triton_gemv.int4_matmul
            for block in triton_gemv.CONFIGS if kind == "int8" else triton_gemv.INT4_CONFIGS:
                if kind == "int8":
                    fn = lambda m, b=block: functools.partial(kernel, x, m.weight, m.weight_scale, block=b)  # noqa: E731
                else:
                    fn = lambda m, b=block: functools.partial(kernel, x, m.qweight, m.scales, m.zeros, block=b)  # noqa: E731
                out.append(("triton", f"triton {block}", stored, fn))
            if kind == "int4":  # would half-precision scales and zeros pay? (not an engine path)
                half = _bytes(layer.qweight) + 2 * layer.scales.numel() * 2
                fn = lambda m: functools.partial(kernel, x, m.qweight, m.scales.half(), m.zeros.half())  # noqa: E731
                out.append(("triton-fp16-scales", "triton, fp16 scales+zeros", half, fn))
    if quantized._kernel_available(kind, device, dtype):
        out.append(("torch", "torch" if kind == "int8" else "torch (tinygemm)", torch_bytes,
                    lambda m: functools.partial(m._torch_kernel, x, dtype)))  # fmt: skip
    dequantize = lambda m: functools.partial(m._dequantize_matmul, x)  # noqa: E731
    out.append(("dequantize", "dequantize + matmul", dequant_bytes, dequantize))
    return out


HEADER = (
    f"{'layer':8s} {'out x in':>13s} {'kind':5s} {'kernel':26s} {'us':>8s} {'MB read':>8s} {'GB/s':>7s} {'peak':>5s}"
)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shapes, n_layers = layer_shapes(args.size)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    known = gpu_bandwidth(name) if device.type == "cuda" else None
    peak = known[1] if known else H100_BANDWIDTH
    peak_label = known[0] if known else "H100 SXM; GPU not known"
    time_ms = _timer(device, args.repeats)
    gen = torch.Generator(device=device).manual_seed(0)
    rows: list[dict[str, Any]] = []
    print(f"{name} · {args.size} layer shapes · {args.dtype} activations · 1 row · int4 group {args.group_size}")
    how = "GPU time per call in a CUDA graph" if device.type == "cuda" else "wall-clock time (a smoke run)"
    print(f"bandwidth share against {peak / 1e12:.2f} TB/s ({peak_label}); {how}")
    print(HEADER + "  check")
    t_start = time.perf_counter()
    with torch.inference_mode():
        for layer_name, (out_f, in_f) in shapes.items():
            if args.only and layer_name not in args.only:
                continue
            w = torch.randn(out_f, in_f, generator=gen, device=device, dtype=torch.float32) * 0.02
            x = torch.randn(1, in_f, generator=gen, device=device, dtype=torch.float32).to(dtype)
            for kind in ["bf16"] if layer_name == "head" else ["bf16", "int8", "int4"]:
                if kind == "bf16":
                    layer = _Float(w.to(dtype))
                    reference = x.float() @ layer.weight.float().T
                    linear = lambda m, x=x: functools.partial(F.linear, x, m.weight)  # noqa: E731
                    cands = [("cublas", "F.linear", _bytes(layer.weight), linear)]
                else:
                    layer = (quantized.Int8Linear.from_weight(w) if kind == "int8"
                             else quantized.Int4Linear.from_weight(w, group_size=args.group_size))  # fmt: skip
                    reference = x.float() @ layer.dequantize().T
                    cands = _candidates(kind, layer, x, device, args.configs)
                layers = _copies(layer, device)
                scale = float(reference.abs().max())
                for path, label, nbytes, make in cands:
                    calls = [make(m) for m in layers]
                    err = float((calls[0]().float() - reference).abs().max()) / scale
                    ok = err <= quantized._PROBE_TOLERANCE.get(dtype, 2e-2)
                    ms = time_ms(calls)
                    row = {
                        "layer": layer_name, "out": out_f, "in": in_f, "kind": kind, "path": path, "kernel": label,
                        "us": ms * 1e3, "bytes": nbytes, "gb_s": nbytes / (ms * 1e-3) / 1e9,
                        "peak_share": nbytes / (ms * 1e-3) / peak, "rel_error": err, "ok": ok,
                    }  # fmt: skip
                    rows.append(row)
                    print(
                        f"{layer_name:8s} {f'{out_f}x{in_f}':>13s} {kind:5s} {label:26s} {row['us']:8.2f} "
                        f"{nbytes / 1e6:8.2f} {row['gb_s']:7.0f} {row['peak_share']:5.0%}  "
                        f"{'ok' if ok else 'WRONG'} ({err:.1e})"
                    )
                del layers, layer, calls
            del w
            if device.type == "cuda":
                torch.cuda.empty_cache()
    summary = _summary(rows, n_layers)
    print()
    print(f"one decode step's matrix products ({n_layers} layers x (qkv + o + gate_up + down) + bf16 head):")
    for line in summary["lines"]:
        print("  " + line)
    print(f"wall time {time.perf_counter() - t_start:.1f} s")
    return {"device": name, "size": args.size, "dtype": args.dtype, "group_size": args.group_size,
            "peak_bytes_per_s": peak, "rows": rows, "step": summary["step"]}  # fmt: skip


class _Float(torch.nn.Module):
    """A float weight as a module, so that it is copied to spill L2 as the quantized layers are."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)


def _summary(rows: list[dict[str, Any]], n_layers: int) -> dict[str, Any]:
    layer_parts = ("qkv", "o", "gate_up", "down")
    head = [r for r in rows if r["layer"] == "head"]
    head_us = head[0]["us"] if head else 0.0
    step: dict[str, float] = {}
    for kind, path in [("bf16", "cublas")] + [(k, p) for k in ("int8", "int4") for p in PATHS]:
        parts = {}
        for r in rows:
            if r["kind"] == kind and r["path"] == path and r["layer"] in layer_parts and r["ok"]:
                parts[r["layer"]] = min(r["us"], parts.get(r["layer"], float("inf")))
        if len(parts) == len(layer_parts):
            step[f"{kind} {path}"] = n_layers * sum(parts.values()) + head_us
    lines = []
    base = step.get("bf16 cublas")
    for key, us in step.items():
        speedup = f"  {base / us:.2f}x bf16" if base else ""
        lines.append(f"{key:18s} {us / 1e3:7.3f} ms{speedup}")
    lines.append(f"(head alone: {head_us / 1e3:.3f} ms, bf16 in every variant)")
    return {"step": step, "lines": lines}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_gemv.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1.7B", choices=list(SIZES), help="layer shapes of this model size")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="activation dtype")
    p.add_argument("--group-size", type=int, default=quant_format.DEFAULT_GROUP_SIZE, choices=quant_format.GROUP_SIZES)
    p.add_argument("--repeats", type=int, default=100, help="calls per timing (CUDA: in one graph)")
    p.add_argument(
        "--configs",
        action="store_true",
        help="also time each Triton block configuration, and int4's with fp16 scales and zeros",
    )
    p.add_argument("--only", nargs="+", default=None, help="only these layers (qkv o gate_up down head)")
    p.add_argument("--json", type=Path, default=None, help="write every row to this JSON file")
    args = p.parse_args(argv)
    result = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
        print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
