"""Command-line options of the benchmark, shared by ``dictation bench`` and ``benchmarks/bench_asr.py``.

Import-light on purpose (no torch, no numpy): ``dictation.cli`` adds these options when it builds its
parser, and ``dictation --version`` must stay fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SIZE_NAMES = ("tiny", "0.6B", "1.7B")  # "tiny": a few-MB model with the real vocabulary, for smoke tests
IMPLS = ("ours", "official")
VARIANT_NAMES = ("bf16", "fp16", "fp32", "int8", "int4")  # dictation.asr.nn.quant_format.VARIANTS, without torch
DECODE_STEPS = ("unfused", "gemv", "compiled")  # besides the engine's default step (runner.OursBench)
GROUP_SIZES = (32, 64, 128, 256)
INT4_METHODS = ("mse", "minmax")  # dictation.asr.nn.quant_format.INT4_METHODS

_DESCRIPTION = """\
Stage-by-stage speed, memory and agreement of our Qwen3-ASR engine's variants (bf16/fp16/fp32,
int8/int4){official_clause}.

Everything runs in one process on the same random checkpoint at the real model size (or --model),
the same synthetic audio, the same prompt and the same number of generated tokens. Stages: load
(also of a pre-quantized folder for int8/int4), log-mel, audio encoder, prefill, decode (ms per
token), end to end, weight and peak memory; agreement of every variant with a reference variant
(greedy ids, teacher-forced top-1, cosine of the first logits).
{where}
examples:
  {prog} --quick
  {prog} --sizes 0.6B --variants fp32 int8 int4 --seconds 5 --tokens 16 --json out.json
  {prog} --sizes 0.6B 1.7B --variants bf16 int8 int4 --device cuda --json gpu.json
"""

# `dictation bench` from an installed copy: no benchmarks/ folder, no official implementation.
_INSTALLED = """
This command measures our engine only: the app never loads the official implementation. The
comparison with it needs a source checkout of the project with the test extra installed (README,
"Run the tests"), where `python benchmarks/bench_asr.py` takes these same options and adds it. The
method and the measured tables are in benchmarks/README.md of the source repository (an installed
copy does not include it).
"""

# benchmarks/bench_asr.py, run from a checkout.
_CHECKOUT = """
The official implementation is measured when transformers 4.57.6 and qwen-asr are installed (the
test extra). See benchmarks/README.md.
"""


def description(official: bool = False, prog: str = "dictation bench") -> str:
    """The --help text: ``official`` for benchmarks/bench_asr.py (which can add the official implementation),
    else for ``dictation bench`` as an installed copy has it."""
    return _DESCRIPTION.format(
        official_clause=", next to the official implementation when it is installed" if official else "",
        where=_CHECKOUT if official else _INSTALLED,
        prog=prog,
    )


DESCRIPTION = description()  # `dictation bench --help`


def add_arguments(p: argparse.ArgumentParser, official: bool = False) -> None:
    """Add the benchmark's options to ``p`` (a parser or a subcommand's parser); ``official``: the parser
    of benchmarks/bench_asr.py, which can run the official implementation."""
    p.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        choices=SIZE_NAMES,
        help="random checkpoints at these model sizes (default: 0.6B and 1.7B on CUDA, else 0.6B; "
        "tiny: a small random model for smoke tests)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="benchmark this model folder or cached repo id instead of random checkpoints (real weights make "
        "the agreement figures meaningful)",
    )
    p.add_argument("--seconds", nargs="+", type=float, default=[5.0, 10.0, 30.0], help="clip lengths (s)")
    p.add_argument("--tokens", type=int, default=32, help="generated tokens per run, the same everywhere (>= 2)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per clip (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per clip before the timed ones")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bf16", "fp16", "fp32"],
        help="float dtype of the official model, of int8/int4's unquantized parts and the default variant; "
        "auto: bf16 on CUDA, fp32 elsewhere",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        default=None,
        choices=VARIANT_NAMES,
        help="our variants to compare (default: the --dtype's own float variant only)",
    )
    p.add_argument(
        "--reference-variant",
        default=None,
        choices=VARIANT_NAMES,
        help="variant the others' tokens and logits are compared with (default: bf16 on CUDA, fp32 elsewhere; "
        "loaded for the comparison only if it is not among --variants)",
    )
    p.add_argument("--group-size", type=int, default=128, choices=GROUP_SIZES, help="int4 group size (default 128)")
    p.add_argument(
        "--int4-method",
        default="mse",
        choices=INT4_METHODS,
        help="how int4 scales and zeros are chosen: mse (least squared error, the default) or minmax (the "
        "group's full range, as before)",
    )
    p.add_argument(
        "--no-prequantized",
        action="store_true",
        help="skip writing and loading pre-quantized folders for int8/int4",
    )
    p.add_argument(
        "--decode-steps",
        nargs="+",
        default=[],
        choices=DECODE_STEPS,
        help="also time the default float variant with these decode steps, each in a column of its own: unfused "
        "(torch ops only, no fused kernels: the path before them), gemv (the fused kernels plus our GEMV with "
        "the norms, SiLU and residual adds folded in: 5 kernels a layer), compiled (the decode step compiled by "
        "torch.compile; its compile time shows in 'warm-up (s)')",
    )
    impl_help = (
        "which implementations (official: needs the test extra)"
        if official
        else "which implementations; official runs only from a source checkout (python benchmarks/bench_asr.py), "
        "this command measures ours"
    )
    p.add_argument("--impl", nargs="+", default=list(IMPLS), choices=IMPLS, help=impl_help)
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="folder for the random checkpoints and pre-quantized folders, kept and reused between runs "
        "(default: a temp folder)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="load everything at once and alternate the runs (fairer on a shared, busy CPU; needs memory for "
        "all models; no peak-memory figures)",
    )
    p.add_argument(
        "--no-release",
        action="store_true",
        help="skip the release-to-text runs (ours streamed while the clip plays, with drafts)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", type=Path, default=None, help="write every number to this JSON file")
    p.add_argument("--quick", action="store_true", help="smoke run: 0.6B, 5 s, 8 tokens, 1 repeat")


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Apply ``--quick`` and check the values; raises ValueError with a one-line message."""
    if args.quick:
        if args.model is None:
            args.sizes = args.sizes or ["0.6B"]
        args.seconds, args.tokens, args.repeats = [5.0], 8, 1
    if args.model is not None and args.sizes:
        raise ValueError("--model and --sizes exclude each other")
    if args.tokens < 2:
        raise ValueError("--tokens must be at least 2 (decode time per token needs one decode step)")
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if args.warmup < 0:
        raise ValueError("--warmup cannot be negative")
    if any(s <= 0.05 for s in args.seconds):
        raise ValueError("--seconds must be longer than 0.05")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be at least 1")
    if args.variants:
        args.variants = list(dict.fromkeys(args.variants))  # drop repeats, keep the order
    args.decode_steps = list(dict.fromkeys(getattr(args, "decode_steps", None) or []))
    return args


def build_parser(prog: str | None = None, official: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=description(official, prog or "dictation bench"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p, official)
    return p


def parse_args(argv: list[str] | None = None, prog: str | None = None, official: bool = False) -> argparse.Namespace:
    p = build_parser(prog, official)
    args = p.parse_args(argv)
    try:
        return check_args(args)
    except ValueError as exc:
        p.error(str(exc))
        raise  # not reached: p.error exits
