"""Training speed and memory of a personal adapter on a random checkpoint of the real size.

    python benchmarks/train_speed.py --size 0.6B --device cpu --steps 3          # CPU: a few minutes
    python benchmarks/train_speed.py --size 0.6B --device cuda --steps 20 --json train.json

Builds (or reuses, in ``--workdir``) the bench's random checkpoint of ``--size``
(``dictation/bench/checkpoints.py``: the real dimensions, no download), makes ``--clips`` synthetic
clips of ``--seconds`` with a transcript of about ``--words`` words, and for each ``--bits`` runs the
trainer the command line runs (``tune.train.train_lora``: the frozen base in NF4 with double
quantization or in its float dtype, LoRA rank ``--rank`` on every attention and MLP projection of
the decoder, gradient checkpointing, one clip a step) for ``--steps`` steps after one untimed
warm-up step. It prints, per ``--bits``:

* the NF4 base's bytes per parameter, measured on the decoder's projections as stored (4.127 bits
  with double quantization, 4.5 without), and the base's decoder projections in MB;
* seconds per step and decoder tokens (prompt with audio, and transcript) per second: the median
  step time after the warm-up;
* on CUDA, the peak GPU memory of the training (model, NF4 base, activations, LoRA, AdamW), and
  the memory the loaded model held before it.

On a random checkpoint the loss means nothing; the amount of compute and memory is the real model's.
A line starting ``SUMMARY`` per ``--bits`` is what ``benchmarks/gpu_check.sh`` collects.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _clips(n: int, seconds: float, words: int, target_tokens: int | None = None):
    import numpy as np

    from dictation.asr.config import SAMPLE_RATE
    from dictation.asr.tune.data import Example

    vocabulary = [
        "the",
        "meeting",
        "moves",
        "to",
        "Tuesday",
        "and",
        "Anna",
        "restarts",
        "every",
        "pod",
        "of",
        "the",
        "cluster",
        "tonight",
    ]
    out = []
    for i in range(n):
        rng = np.random.default_rng(i)
        t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
        audio = 0.1 * np.sin(2 * np.pi * (180 + 40 * i) * t) + 0.02 * rng.standard_normal(t.shape)
        text = " ".join(vocabulary[(i + k) % len(vocabulary)] for k in range(words)).capitalize() + "."
        if target_tokens is not None:  # the random checkpoint's tokenizer spells a word letter by letter
            text = text[: max(1, target_tokens - TARGET_OVERHEAD)]
        out.append(Example(audio.astype(np.float32), f"language English<asr_text>{text}", f"clip {i}"))
    return out


# Target tokens besides the text: ``language English<asr_text>`` (the real tokenizer: 4) and <|im_end|>.
TARGET_OVERHEAD = 5


def measure(folder: Path, bits: int, args: argparse.Namespace) -> dict:
    import torch

    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.config import AsrConfig
    from dictation.asr.device import resolve_device
    from dictation.asr.text.prompt import PromptBuilder
    from dictation.asr.tune.train import TrainOptions, train_lora, training_dtype

    device = resolve_device(args.device)
    dtype = training_dtype(device)
    cfg = AsrConfig.from_file(folder / "config.json")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    model = load_model(folder, cfg, device, dtype)
    prompt = PromptBuilder.from_folder(
        folder, audio_token_id=cfg.special.audio_token_id, vocab_size=cfg.text.vocab_size
    )
    loaded_s = time.perf_counter() - t0
    loaded_bytes = torch.cuda.memory_allocated(device) if cuda else None
    examples = _clips(args.clips, args.seconds, args.words, args.target_tokens)
    stamps: list[float] = []

    def progress(_p) -> None:
        if cuda:
            torch.cuda.synchronize(device)
        stamps.append(time.perf_counter())

    options = TrainOptions(
        steps=args.steps + 1, rank=args.rank, alpha=2.0 * args.rank, bits=bits, seed=0, batch_size=args.batch_size,
        layers=args.layers or None, checkpointing=args.checkpointing,
    )  # fmt: skip
    t0 = time.perf_counter()
    result = train_lora(model, prompt, examples, options, progress=progress)
    total_s = time.perf_counter() - t0
    first_step_s = stamps[0] - t0  # NF4 quantization, the clips' encoder and frozen layers, one step
    step_s = statistics.median(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    tokens_per_step = result.tokens / len(result.losses)
    layers = [m.base for name, m in result.lora.items() if name != "lm_head"]
    parameters = sum(m.in_features * m.out_features for m in layers)
    if bits == 4:
        base_bytes = sum(m.nbytes for m in layers)
    else:
        base_bytes = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    out = {
        "bits": bits,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "load_s": round(loaded_s, 2),
        "prepare_and_train_s": round(total_s, 2),
        "prepare_and_first_step_s": round(first_step_s, 2),
        "batch_size": args.batch_size,
        "layers": options.layers,
        "steps_timed": args.steps,
        "s_per_step": round(step_s, 4),
        "tokens_per_step": tokens_per_step,
        "target_tokens_per_clip": result.target_tokens / len(result.losses) / args.batch_size,
        "tokens_per_s": round(tokens_per_step / step_s, 1),
        "decoder_projection_parameters": parameters,
        "base_projection_bytes": base_bytes,
        "base_bytes_per_parameter": round(base_bytes / parameters, 4),
        "lora_parameters": sum(m.lora_A.numel() + m.lora_B.numel() for m in result.lora.values()),
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
    }
    if cuda:
        out["loaded_gpu_bytes"] = loaded_bytes
        out["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
    del model, result
    return out


def personalise(folder: Path, workdir: Path, args: argparse.Namespace) -> int:
    """The app's Personalise on ``args.personalise`` dictations: its options (the defaults) and held-out
    share, timed from the start to the scored adapter. Held-out transcripts stop at
    ``--target-tokens`` tokens: what a real model says for such a clip (a random one never stops)."""
    import functools

    import dictation.asr
    from dictation.app.personalise import held_out_share
    from dictation.asr.tune.data import Sample
    from dictation.asr.tune.train import TrainOptions
    from dictation.audio.wav import write_wav
    from dictation.training import train_adapter

    clips = workdir / f"dictations-{args.personalise}"
    clips.mkdir(exist_ok=True)
    samples = []
    for i, example in enumerate(_clips(args.personalise, args.seconds, args.words, args.target_tokens)):
        write_wav(clips / f"{i}.wav", example.audio, 16000)
        samples.append(Sample(clips / f"{i}.wav", example.target, f"dictation {i}"))
    tokens = args.target_tokens or 64
    dictation.asr.EngineOptions = functools.partial(dictation.asr.EngineOptions, max_new_tokens=tokens)
    out = Path(tempfile.mkdtemp(prefix="personal-", dir=workdir)) / "adapter"
    stages: list[tuple[float, str]] = []
    stamps: list[float] = []  # the end of every training step
    t0 = time.perf_counter()
    report = train_adapter(
        str(folder), samples, out, TrainOptions(), device=args.device, val=held_out_share(len(samples)),
        on_status=lambda text: stages.append((time.perf_counter() - t0, text)),
        on_progress=lambda _p: stamps.append(time.perf_counter() - t0),
    )  # fmt: skip
    total = time.perf_counter() - t0
    for at, text in stages:
        print(f"  {at:7.1f} s  {text}", flush=True)
    # the training stage split: loading, NF4 and the clips' frozen part up to the end of step 1, then the steps
    steps_s = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    training = next(at for at, text in stages if text.startswith("training on"))
    print(
        f"STEPS step 1 done {stamps[0] - training:.1f} s after the training stage began (loading, NF4, the clips' "
        f"frozen part, one step); then {statistics.median(steps_s):.2f} s a step (median; fastest "
        f"{min(steps_s):.2f}, slowest {max(steps_s):.2f}, {len(steps_s)} steps)",
        flush=True,
    )
    print(f"LOSS {' '.join(f'{x:.2f}' for x in report.losses)}")
    print(
        f"SUMMARY personalise {args.size} on {args.personalise} dictations ({report.train_clips} trained on, "
        f"{report.val_clips} held out) on {args.device}: {total:.0f} s in all, {report.steps} steps, loss "
        f"{report.losses[0]:.2f} -> {report.final_loss:.2f}",
        flush=True,
    )
    if args.json:
        data = {"seconds": total, "steps": report.steps, "losses": report.losses, "stages": stages, "step_ends": stamps}
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.6B", choices=["tiny", "0.6B", "1.7B"])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 16], choices=[4, 16])
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--clips", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each synthetic clip")
    parser.add_argument("--words", type=int, default=12, help="words in each clip's transcript")
    parser.add_argument(
        "--target-tokens", type=int, default=21,
        help="target tokens a clip (default 21: 12 English words and the language prefix, as the real tokenizer "
        "cuts them; the random checkpoint's spells letters); 0: the whole --words text",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=2, help="clips a step (default 2)")
    parser.add_argument("--layers", type=int, default=8, help="top decoder layers adapted (0: all; default 8)")
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument(
        "--personalise", type=int, default=0, metavar="N",
        help="instead: the whole default Personalise (dictation.training.train_adapter, the app's options and "
        "held-out share) on N synthetic dictations, timed, with its loss curve",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch's default if unset)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the random checkpoint is built and kept")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    from dictation.bench.checkpoints import build_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="train_speed_"))
    folder = build_checkpoint(args.size, workdir, log=lambda line: print(line, file=sys.stderr))
    args.target_tokens = args.target_tokens or None
    if args.personalise:
        return personalise(folder, workdir, args)
    results = []
    for bits in args.bits:
        r = measure(folder, bits, args)
        results.append(r)
        base = "NF4 + double quant" if bits == 4 else r["dtype"]
        line = (
            f"SUMMARY train {args.size} --bits {bits} ({base} base) on {r['device']}: {r['s_per_step']:.3f} s/step "
            f"of {r['batch_size']} clips (top {r['layers'] or 'all'} layers adapted), "
            f"{r['tokens_per_s']:.0f} tokens/s ({r['tokens_per_step']:.0f} tokens a step), base "
            f"{r['base_bytes_per_parameter']:.4f} bytes/parameter ({r['base_projection_bytes'] / 1e6:.0f} MB for "
            f"{r['decoder_projection_parameters'] / 1e6:.0f}M decoder projection parameters)"
        )
        if "peak_gpu_bytes" in r:
            line += f", peak GPU memory {r['peak_gpu_bytes'] / 2**30:.2f} GiB (model loaded: "
            line += f"{r['loaded_gpu_bytes'] / 2**30:.2f} GiB)"
        print(line, flush=True)
    meta = {
        "size": args.size,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "steps": args.steps,
        "rank": args.rank,
        "clip_seconds": args.seconds,
    }
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
