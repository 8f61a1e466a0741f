"""The command line's parser: every subcommand, its options and help, and the function that runs it
(engine_commands, app_commands). Building it imports the engine's option tables (dictation.asr.limits,
dictation.bench.options), not torch; `dictation` alone starts the app without building it
(dictation.cli.main)."""

from __future__ import annotations

import argparse

from dictation import __version__
from dictation.cli.app_commands import cmd_devices, cmd_doctor, cmd_install_desktop, cmd_remote
from dictation.cli.engine_commands import (
    cmd_bench,
    cmd_convert,
    cmd_download,
    cmd_merge_lora,
    cmd_quantize,
    cmd_train_adapter,
    cmd_transcribe,
)

DEFAULT_DOWNLOAD = "Qwen/Qwen3-ASR-1.7B"
VARIANT_CHOICES = [
    "bf16",
    "fp16",
    "fp32",
    "int8",
    "int4",
]  # dictation.asr.nn.quant_format.VARIANTS, without importing torch


QUANTIZE_DESCRIPTION = """\
Write a copy of a Qwen3-ASR model folder whose text decoder is stored as 8-bit (int8) or 4-bit
(int4) integers: smaller on disk and in memory, and quicker to load than choosing the int8/int4
weights variant, which quantizes the model at every start. The audio encoder, the embeddings and
the output head are kept as they are; the tokenizer and other files are copied. The new folder
records its variant in config.json and is used like any model folder: choose it on the Model page
of the settings, or pass it to `dictation transcribe --model`.

example:
  dictation quantize --model Qwen/Qwen3-ASR-1.7B --variant int8 --out ~/models/qwen3-asr-1.7b-int8
"""


TRAIN_EPILOG = """\
data: --data FILE.jsonl, one clip a line in the official Qwen3-ASR fine-tuning format,
  {"audio": "clip.wav", "text": "language English<asr_text>The transcript."}
(`language None` if unknown; or a plain "text" with an optional "language" key; audio paths are
relative to the file), or --from-history: the dictations you corrected in the app's History window.

Ctrl+C stops after the current step and keeps a checkpoint: the same command with --resume goes on
and gives the adapter an uninterrupted run gives.

example:
  dictation train-adapter --model Qwen/Qwen3-ASR-0.6B --from-history --out ~/adapters/mine --val 0.1
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dictation", description="Local push-to-talk dictation (Qwen3-ASR).")
    parser.add_argument("--version", action="version", version=f"dictation {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command")

    t = sub.add_parser("transcribe", help="transcribe WAV files")
    t.add_argument("files", nargs="+", metavar="FILE", help="WAV files (any rate, mono or stereo)")
    t.add_argument("--model", required=True, help="model folder or repo id in the local Hugging Face cache")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    t.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    t.add_argument(
        "--variant",
        default=None,
        choices=VARIANT_CHOICES,
        help="weights: bf16/fp16/fp32, or int8/int4 (decoder quantized at load; a pre-quantized folder says its own)",
    )
    t.add_argument(
        "--adapter",
        action="append",
        metavar="DIR[:WEIGHT]",
        help="PEFT LoRA adapter folder, optionally with a weight (repeatable; applied in order)",
    )
    t.add_argument("--language", default=None, help="force a language (name or ISO code); default: detect")
    from dictation.asr import limits

    t.add_argument(
        "--context",
        default="",
        help=f"background text / vocabulary to bias recognition (up to {limits.MAX_CONTEXT_CHARS:,} characters)",
    )
    t.add_argument(
        "--vocabulary",
        action="store_true",
        help="also give the model the app's vocabulary (Settings > Vocabulary: your text and the words learned "
        "from corrections), before --context",
    )
    t.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"token budget of a pass (default: scales with length; at most {limits.MAX_TOKENS_PER_SECOND} "
        "a second of audio)",
    )
    t.add_argument("--json", action="store_true", help="one JSON object per file")
    t.set_defaults(func=cmd_transcribe)

    d = sub.add_parser("download", help="fetch a model into the Hugging Face cache")
    d.add_argument("model", nargs="?", default=DEFAULT_DOWNLOAD, help=f"repo id (default {DEFAULT_DOWNLOAD})")
    d.set_defaults(func=cmd_download)

    q = sub.add_parser(
        "quantize",
        help="write a pre-quantized model folder (int8 / int4 decoder)",
        description=QUANTIZE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("--model", required=True, help="source model folder or cached repo id (bf16/fp16/fp32)")
    q.add_argument(
        "--variant", required=True, choices=["int8", "int4"], help="int8: closest to the original; int4: smallest"
    )
    q.add_argument("--group-size", type=int, default=None, help="int4 group size along the inputs (default 128)")
    q.add_argument("--out", required=True, help="new folder to write (must not exist or be empty)")
    q.set_defaults(func=cmd_quantize)

    m = sub.add_parser("merge-lora", help="merge LoRA adapters into a standalone model folder")
    m.add_argument("--model", required=True, help="base model folder or cached repo id")
    m.add_argument("--adapter", action="append", required=True, metavar="DIR[:WEIGHT]", help="adapter (repeatable)")
    m.add_argument("--out", required=True, help="new folder to write (must not exist or be empty)")
    m.set_defaults(func=cmd_merge_lora)

    ta = sub.add_parser(
        "train-adapter",
        help="train a personal LoRA adapter (QLoRA) on your own clips or corrected dictations",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ta.add_argument("--model", required=True, help="base model folder or cached repo id (floating point)")
    source = ta.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="FILE.jsonl", help="clips and their transcripts (see below)")
    source.add_argument("--from-history", action="store_true", help="the dictations you corrected in the app")
    ta.add_argument("--out", required=True, help="new adapter folder (never overwritten)")
    length = ta.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, help="optimizer steps (default: 8 epochs, 40 to 160 steps)")
    length.add_argument("--epochs", type=int, default=None, help="instead of --steps: passes over the clips")
    ta.add_argument("--rank", type=int, default=16, help="LoRA rank (default 16)")
    ta.add_argument("--alpha", type=float, default=None, help="LoRA alpha (default 2 x rank)")
    ta.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    ta.add_argument("--targets", default=None, help="comma-separated layers (default: q,k,v,o,gate,up,down _proj)")
    ta.add_argument(
        "--device", default="auto", help="auto (default), cpu, cuda, cuda:N (bf16 on a GPU, fp32 on the CPU)"
    )
    ta.add_argument("--bits", type=int, choices=[4, 16], default=4, help="base in NF4 (4, default) or float (16)")
    ta.add_argument("--no-double-quant", action="store_true", help="NF4 with fp32 block scales (debugging)")
    ta.add_argument("--val", type=float, default=0.0, metavar="FRACTION", help="share held out: WER/CER before/after")
    ta.add_argument("--batch-size", type=int, default=None, help="examples per step (default 2)")
    ta.add_argument("--layers", type=int, default=None, help="top decoder layers adapted (default 8)")
    ta.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ta.add_argument("--resume", action="store_true", help="go on with the interrupted run for --out")
    ta.set_defaults(func=cmd_train_adapter)

    c = sub.add_parser("convert", help="write a model as GGUF or in the other checkpoint layout (hf / original)")
    c.add_argument("--model", required=True, help="source model folder or cached repo id (bf16/fp16/fp32)")
    c.add_argument("--adapter", action="append", metavar="DIR[:WEIGHT]", help="adapter merged first (repeatable)")
    c.add_argument("--to", required=True, choices=["gguf", "hf", "original"], help="what to write")
    c.add_argument("--out", required=True, help="new file (gguf) or folder (hf, original); never overwritten")
    c.add_argument(
        "--type", help="gguf: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K (default F16); else F32 F16 BF16"
    )
    c.add_argument(
        "--gguf-layout",
        choices=["single", "pair"],
        default="single",
        help="one qwen3asr file, or llama.cpp's text model + mmproj-<name>",
    )
    c.add_argument(
        "--quantize-all",
        action="store_true",
        help="gguf: give the audio tower, embeddings and head the --type too (default: >= 8 bits)",
    )
    c.set_defaults(func=cmd_convert)

    from dictation.bench import options as bench_options

    b = sub.add_parser(
        "bench",
        help="compare the engine's variants' speed, memory and agreement",
        description=bench_options.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_options.add_arguments(b)
    b.set_defaults(func=cmd_bench)

    v = sub.add_parser("devices", help="list microphones (input devices) and their default rates")
    v.set_defaults(func=cmd_devices)

    dr = sub.add_parser(
        "doctor",
        help="check hotkeys, text output, microphone, GPU, model and files; print the fixes",
        description="Check what works on this computer (session, hotkeys, text output, microphone, torch and "
        "the GPU, the model, the app's files) and print the fix for each problem. Exit status 1 if any "
        "problem was found.",
    )
    dr.add_argument("--json", action="store_true", help="print the checks as JSON")
    dr.set_defaults(func=cmd_doctor)

    i = sub.add_parser(
        "install-desktop",
        help="Linux: add Dictation to the app menu (desktop entry and icon), optionally as a systemd user service",
        description="Write ~/.local/share/applications/dictation.desktop and the app icon (hicolor theme) for "
        "this installation; --systemd also writes ~/.config/systemd/user/dictation.service. --uninstall "
        "removes them.",
    )
    i.add_argument("--systemd", action="store_true", help="also write the systemd user unit")
    i.add_argument("--uninstall", action="store_true", help="remove what install-desktop wrote")
    i.set_defaults(func=cmd_install_desktop)

    remote_help = {
        "toggle": "start dictation in the running app, or stop it if recording",
        "start": "start dictation in the running app (no-op if recording)",
        "stop": "stop dictation in the running app and type the text",
        "cancel": "throw away the recording in progress",
        "status": "print the running app's state",
        "quit": "quit the running app",
    }
    for name, text in remote_help.items():
        r = sub.add_parser(name, help=text, description=text + ". For compositor key bindings on Wayland.")
        if name == "status":
            r.add_argument("--json", action="store_true", help="print the reply as JSON")
        r.set_defaults(func=cmd_remote)
    return parser
