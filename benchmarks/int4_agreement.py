"""Where int4's disagreement with the float model comes from, on the bench's random checkpoints.

One float32 model is loaded once; each experiment puts other weights into its decoder's linear layers
(in place) and measures what the bench's agreement rows measure against the untouched model: the
cosine of the first logits and the teacher-forced top-1 (the reference's greedy ids fed in). Then
the weights go back. Experiments, in the order given:

  folder:METHOD:GROUP   a pre-quantized int4 folder (write_quantized_folder, kept in --workdir), read
                        back by numpy alone from the documented format (not by quantized.py); also prints
                        the relative error |w' - w| / |w| of every layer against the float weights
  noise:REL             Gaussian noise of REL times each weight matrix's RMS (REL = int4's relative
                        error gives a model that is as far from the weights without any rounding)
  int8                  symmetric per-row int8 as numpy computes it
  METHOD:GROUP          int4 by quant_format.quantize_int4 (method mse or minmax), dequantized to float32
  modules:METHOD:GROUP  the real Int4Linear layers (quantize_model; the CPU kernels in float32):
                        must match METHOD:GROUP; always run last

    python benchmarks/int4_agreement.py --size 1.7B --workdir /tmp/bench_ckpt \\
        folder:minmax:128 noise:0.0998 mse:128 mse:64 modules:mse:128

Random weights make every number here a property of a random network (see benchmarks/README.md,
"int4 on the random checkpoints"); the point is to compare the experiments with each other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dictation.asr.checkpoints.locate import checkpoint_name  # noqa: E402
from dictation.asr.nn import quant_format, quant_swap, quantized  # noqa: E402
from dictation.asr.tune import quantize  # noqa: E402
from dictation.bench.checkpoints import SIZES, build_checkpoint, prequantized_folder  # noqa: E402
from dictation.bench.measure import synth_audio  # noqa: E402
from dictation.bench.ours import OursBench  # noqa: E402


def numpy_int4_folder(folder: Path, names: list[str], layout: str):
    """name -> float64 weight read back from a pre-quantized int4 folder by numpy: qweight uint8
    [out, in/2] with the even input in each byte's high nibble, w = q * scales + zeros per group."""
    from safetensors import safe_open

    f = safe_open(str(folder / "model.safetensors"), framework="np")

    def weight(name: str) -> np.ndarray:
        base = checkpoint_name(name, layout)
        packed = f.get_tensor(f"{base}.qweight")
        scales, zeros = f.get_tensor(f"{base}.scales").astype(np.float64), f.get_tensor(f"{base}.zeros")
        q = np.empty((packed.shape[0], packed.shape[1] * 2), np.float64)
        q[:, 0::2], q[:, 1::2] = packed >> 4, packed & 0x0F
        group = q.shape[1] // scales.shape[1]
        w = q.reshape(q.shape[0], -1, group) * scales[..., None] + zeros.astype(np.float64)[..., None]
        return w.reshape(q.shape)

    return {name: (lambda n=name: weight(n)) for name in names}


def numpy_int8(w: np.ndarray) -> np.ndarray:
    scale = np.abs(w).max(axis=1, keepdims=True) / 127
    scale[scale == 0] = 1
    return np.clip(np.round(w / scale), -127, 127) * scale


class Experiment:
    def __init__(self, size: str, workdir: Path, seconds: float, tokens: int) -> None:
        self.workdir = workdir
        self.folder = build_checkpoint(size, workdir, log=print)
        self.bench = OursBench(self.folder, torch.device("cpu"), "fp32", "fp32", quant_format.DEFAULT_GROUP_SIZE)
        self.bench.load()
        self.model = self.bench.engine.model
        # float32 everywhere (the quantized layers too): the comparison is about the weights
        self.model.options = replace(self.model.options, cpu_bf16_compute=False)
        self.names = quant_swap.quantizable_names(self.model.cfg.text.num_hidden_layers)
        self.layout = self.model.cfg.layout
        from safetensors import safe_open

        self.source = safe_open(str(self.folder / "model.safetensors"), framework="pt")
        self.audio, self.tokens = synth_audio(seconds), tokens
        self.reference = self._reference()

    def original(self, name: str) -> torch.Tensor:
        return self.source.get_tensor(checkpoint_name(name, self.layout) + ".weight").float()

    def _reference(self) -> tuple[list[int], torch.Tensor]:
        model = self.model
        with torch.inference_mode():
            embeds, _ = self.bench._prompt_embeds(self.audio)
            logits = model.prefill(embeds, self.tokens)
            first, ids, position = logits.float().reshape(-1).clone(), [int(logits.argmax())], embeds.shape[1]
            for _ in range(self.tokens - 1):
                ids.append(int(model.step(torch.tensor([ids[-1]]), position).argmax()))
                position += 1
        return ids, first

    def set_weights(self, make) -> list[float]:
        """Put make(name, float weight) into every decoder linear layer; returns each layer's relative error."""
        modules = dict(self.model.named_modules())
        errors = []
        with torch.no_grad():
            for name in self.names:
                w = self.original(name)
                new = torch.as_tensor(make(name, w)).float()
                errors.append(float((new - w).norm() / w.norm()))
                modules[name].weight.copy_(new)
        self.model.sync_weights()
        return errors

    def measure(self) -> tuple[float, float, torch.Tensor]:
        preds, first = self.bench.teacher_forced(self.audio, self.reference[0])
        cosine = float(
            torch.nn.functional.cosine_similarity(first.double().reshape(-1), self.reference[1].double(), dim=0)
        )
        top1 = sum(a == b for a, b in zip(preds, self.reference[0], strict=False)) / len(self.reference[0])
        return cosine, top1, first


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    exp = Experiment(args.size, args.workdir, args.seconds, args.tokens)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{args.size}: {args.seconds:g}-s clip, {args.tokens} teacher-forced tokens, against the float32 model")
    cosine, top1, _ = exp.measure()
    print(f"  {'reference (itself)':24s} cosine {cosine:.4f}  top-1 {top1:.2f}")
    experiments = sorted(args.experiments, key=lambda e: e.startswith("modules:"))  # modules replace the layers
    firsts: dict[str, torch.Tensor] = {}
    for spec in experiments:
        t0 = time.perf_counter()
        kind, _, rest = spec.partition(":")
        errors = None
        if kind == "folder":
            method, group = rest.split(":")
            with _method(method):
                folder, _ = prequantized_folder(exp.folder, args.workdir, "int4", int(group), log=print)
            read = numpy_int4_folder(folder, exp.names, exp.layout)
            errors = exp.set_weights(lambda name, w, read=read: read[name]())
        elif kind == "noise":
            errors = exp.set_weights(lambda name, w, rel=float(rest): w + _noise(w, gen) * rel)
        elif kind == "int8":
            errors = exp.set_weights(lambda name, w: numpy_int8(w.double().numpy()))
        elif kind in quant_format.INT4_METHODS:
            errors = exp.set_weights(lambda name, w, g=int(rest), m=kind: _dequantized(w, g, m))
        elif kind == "modules":
            method, group = rest.split(":")
            exp.set_weights(lambda name, w: w)
            with _method(method):
                quantize.quantize_model(exp.model, "int4", group_size=int(group))
            exp.model.spread_options()  # the new int4 layers compute in float32 too
        else:
            raise SystemExit(f"unknown experiment {spec!r}")
        cosine, top1, first = exp.measure()
        firsts[spec] = first
        row = {"experiment": spec, "cosine": cosine, "top1": top1, "seconds": time.perf_counter() - t0}
        line = f"  {spec:24s} cosine {cosine:.4f}  top-1 {top1:.2f}"
        if errors is not None:
            row["layer_error"] = {"mean": float(np.mean(errors)), "min": min(errors), "max": max(errors)}
            line += f"  layer error {np.mean(errors):.4f} ({min(errors):.4f}-{max(errors):.4f})"
        twin = f"{rest.split(':')[0]}:{rest.split(':')[1]}" if kind == "modules" else None
        if twin in firsts:  # the kernels against the same weights in a float model
            row["cosine_to_float_twin"] = float(
                torch.nn.functional.cosine_similarity(first.double(), firsts[twin].double(), dim=0)
            )
            line += f"  vs {twin} in float: cosine {row['cosine_to_float_twin']:.6f}"
        print(line, flush=True)
        rows.append(row)
    return rows


def _noise(w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Gaussian noise with the RMS of ``w``."""
    return torch.randn(w.shape, generator=gen) * w.square().mean().sqrt()


def _dequantized(w: torch.Tensor, group: int, method: str) -> torch.Tensor:
    layer = quantized.Int4Linear(w.shape[1], w.shape[0], device="meta", group_size=group)
    layer.qweight, layer.scales, layer.zeros = quant_format.quantize_int4(w, layer.group_size, method=method)
    return layer.dequantize()


@contextlib.contextmanager
def _method(method: str):
    saved, quant_format.INT4_METHOD = quant_format.INT4_METHOD, method
    try:
        yield
    finally:
        quant_format.INT4_METHOD = saved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="int4_agreement.py", description=__doc__.split("\n\n")[0])
    p.add_argument("experiments", nargs="+", help="see the module docstring")
    p.add_argument("--size", default="0.6B", choices=list(SIZES))
    p.add_argument("--workdir", type=Path, required=True, help="random checkpoints and int4 folders, kept")
    p.add_argument("--seconds", type=float, default=5.0, help="clip length")
    p.add_argument("--tokens", type=int, default=12, help="teacher-forced tokens")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps({"size": args.size, "tokens": args.tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
