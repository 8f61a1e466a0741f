"""The ``dictation`` command. Heavy imports (torch) happen inside the subcommands."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from dictation import __version__

DEFAULT_DOWNLOAD = "Qwen/Qwen3-ASR-1.7B"
VARIANT_CHOICES = [
    "bf16",
    "fp16",
    "fp32",
    "int8",
    "int4",
]  # dictation.asr.nn.quant_format.VARIANTS, without importing torch


def _fail(message: str) -> int:
    print(f"dictation: error: {message}", file=sys.stderr)
    return 1


def cmd_transcribe(args: argparse.Namespace) -> int:
    from dictation.asr import SAMPLE_RATE, AsrEngine, AsrError, EngineOptions, limits
    from dictation.asr.engine import is_silent
    from dictation.asr.text.prompt import normalize_language
    from dictation.audio.wav import load_audio_16k
    from dictation.cli_progress import TranscribeProgress

    try:
        normalize_language(args.language)
    except AsrError as exc:
        return _fail(str(exc))
    problem = limits.check_max_new_tokens(args.max_new_tokens)
    if problem:
        return _fail(f"--max-new-tokens: {problem}")
    context = args.context or ""
    if args.vocabulary:  # the app's: the user's own text, then the words learned from corrections
        from dictation.config.store import SettingsStore
        from dictation.vocabulary import model_context

        context = "\n".join(part for part in (model_context(SettingsStore().load().transcription), context) if part)
    problem = limits.check_context(context)
    if problem:
        return _fail(f"{'--vocabulary with ' if args.vocabulary else ''}--context: {problem}")

    # Read every file first, so a bad path is reported before a long model load.
    clips: list[tuple[str, object]] = []
    failed = 0
    for name in args.files:
        try:
            audio = load_audio_16k(Path(name))
            if is_silent(audio):
                raise AsrError(f"{name}: audio is silent (nothing to transcribe)")
        except AsrError as exc:
            failed += 1
            _fail(str(exc))
            continue
        clips.append((name, audio))
    if not clips:
        return 1

    engine = AsrEngine(
        EngineOptions(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            variant=args.variant,
            adapters=tuple(args.adapter or ()),
        )
    )
    import torch

    try:
        engine.prepare()
    except AsrError as exc:
        return _fail(str(exc))
    except torch.OutOfMemoryError:
        return _fail(
            f"{args.model}: not enough {args.device} memory to load the model; try --device cpu or the 0.6B model"
        )
    logging.getLogger(__name__).info("model: %s", engine.model_label)

    for name, audio in clips:
        seconds = len(audio) / SAMPLE_RATE
        _warn_budget(name, seconds, args.max_new_tokens)
        progress = TranscribeProgress(name) if seconds >= PROGRESS_SECONDS else None
        try:
            result = engine.transcribe_with_progress(
                audio, language=args.language, context=context, max_new_tokens=args.max_new_tokens,
                on_progress=progress and progress.update,
            )  # fmt: skip
        except AsrError as exc:
            failed += 1
            _fail(f"{name}: {exc}")
            continue
        except torch.OutOfMemoryError:
            failed += 1
            _fail(f"{name}: out of memory while transcribing; try a shorter clip or --device cpu")
            continue
        finally:
            if progress is not None:
                progress.close()
        if args.json:
            print(
                json.dumps(
                    {
                        "file": name,
                        "text": result.text,
                        "language": result.language,
                        "token_ids": result.token_ids,
                        "audio_seconds": round(result.audio_seconds, 3),
                        "timings": {k: round(v, 4) for k, v in result.timings.items()},
                        "truncated": result.truncated,
                        "model": engine.model_label,
                    },
                    ensure_ascii=False,
                ),
                flush=True,
            )
        elif len(args.files) > 1:
            print(f"{name}: {result.text}", flush=True)
        else:
            print(result.text, flush=True)
    return 1 if failed else 0


PROGRESS_SECONDS = 60.0  # files at least this long show their progress on stderr


def _warn_budget(name: str, seconds: float, asked: int | None) -> None:
    """Say so when --max-new-tokens is more than the file's audio can need (the engine lowers it)."""
    from dictation.asr import limits

    most = limits.max_new_tokens_for(min(seconds, limits.MAX_PASS_SECONDS))
    if asked is not None and asked > most:
        print(
            f"dictation: warning: {name}: --max-new-tokens {asked} is more than {seconds:.1f} s of audio can need; "
            f"using at most {most} tokens a pass ({limits.MAX_TOKENS_PER_SECOND} a second)",
            file=sys.stderr,
        )


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


def cmd_quantize(args: argparse.Namespace) -> int:
    from dictation.asr import AsrError
    from dictation.asr.checkpoints.hub import resolve_model
    from dictation.asr.nn.quant_format import DEFAULT_GROUP_SIZE
    from dictation.asr.tune.writers import write_quantized_folder

    bar = _CountBar(f"quantizing to {args.variant}") if sys.stderr.isatty() else None
    try:
        source = resolve_model(args.model)
        out = write_quantized_folder(
            args.model,
            Path(args.out),
            args.variant,
            group_size=args.group_size or DEFAULT_GROUP_SIZE,
            on_progress=bar.update if bar is not None else None,
        )
    except AsrError as exc:
        if bar is not None:
            bar.close()
        return _fail(str(exc))
    if bar is not None:
        bar.close()
    before, after = _weights_bytes(source), _weights_bytes(out)
    print(f"Wrote the {args.variant} model to {out}")
    share = f" ({after / before:.0%} of the source's {_size(before)})" if before else ""
    print(f"  weights: {_size(after)}{share}")
    print(f"  use it: choose this folder on the Model page, or `dictation transcribe --model {out} FILE.wav`")
    return 0


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _weights_bytes(folder: Path) -> int:
    """The size of a model folder's weight files (what quantizing shrinks)."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".safetensors", ".gguf") and p.is_file())


def cmd_merge_lora(args: argparse.Namespace) -> int:
    from dictation.asr import AsrError
    from dictation.asr.tune.writers import write_merged_folder

    try:
        out = write_merged_folder(args.model, args.adapter, Path(args.out))
    except AsrError as exc:
        return _fail(str(exc))
    print(out)
    return 0


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


def cmd_train_adapter(args: argparse.Namespace) -> int:
    import signal
    import threading
    import time

    from dictation.asr import AsrError
    from dictation.asr.tune.train import TrainingCancelled, TrainOptions
    from dictation.training import read_samples, samples_from_history, train_adapter

    options = TrainOptions(
        steps=args.steps if args.steps is not None else TrainOptions.steps, epochs=args.epochs, rank=args.rank,
        alpha=args.alpha if args.alpha is not None else 2.0 * args.rank, lr=args.lr, bits=args.bits,
        double_quant=not args.no_double_quant, seed=args.seed,
        batch_size=args.batch_size if args.batch_size is not None else TrainOptions.batch_size,
        layers=args.layers if args.layers is not None else TrainOptions.layers,
        targets=tuple(t.strip() for t in (args.targets or "").split(",") if t.strip()) or TrainOptions.targets,
    )  # fmt: skip
    stop = threading.Event()
    last = [0.0]

    def progress(p) -> None:
        now = time.monotonic()
        if p.step not in (1, p.steps) and now - last[0] < (0.5 if sys.stderr.isatty() else 5.0):
            return
        last[0] = now
        left = f"{int(p.seconds_left // 60)}:{int(p.seconds_left % 60):02d}"
        line = f"step {p.step}/{p.steps}  loss {p.loss:.4f}  {left} left"
        sys.stderr.write(f"\r{line}\033[K" if sys.stderr.isatty() else line + "\n")
        if sys.stderr.isatty() and p.step == p.steps:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def status(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def interrupt(*_) -> None:  # the first Ctrl+C stops after the step with a checkpoint, a second at once
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nstopping after this step (Ctrl+C again: at once)", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        samples = samples_from_history() if args.from_history else read_samples(args.data)
        report = train_adapter(
            args.model, samples, Path(args.out), options, device=args.device, val=args.val, resume=args.resume,
            on_progress=progress, on_status=status, should_stop=stop.is_set,
        )  # fmt: skip
    except TrainingCancelled as exc:
        return _fail(f"{exc}; the same command with --resume goes on")
    except AsrError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("training interrupted; no adapter was written (a checkpoint saved before is kept for --resume)")
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"Wrote the adapter to {report.out}")
    print(f"  {report.steps} steps on {report.train_clips} clips in {report.seconds:.1f} s "
          f"({report.tokens_per_s:.0f} tokens/s), final loss {report.final_loss:.4f}")  # fmt: skip
    if report.base_bits_per_parameter is not None:
        dq = "" if options.double_quant else " without double quantization"
        print(f"  base: NF4{dq}, {report.base_bits_per_parameter:.3f} bits per parameter")
    if report.before is not None and report.after is not None:
        print(f"  held out: before {report.before}; after {report.after}")
    elif report.unscored:
        print(f"  held out: {report.unscored}")
    elif report.val_clips == 0:
        from dictation.training import MIN_HELD_OUT

        print(f"  held out: none, so no WER/CER can be given yet (--val: it takes {MIN_HELD_OUT} held-out clips)")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from dictation.asr import AsrError
    from dictation.asr.tune.convert import convert

    bar = _CountBar(f"converting to {args.to}") if sys.stderr.isatty() else None
    try:
        paths = convert(
            args.model, args.to, Path(args.out), adapters=args.adapter or (), type_name=args.type,
            gguf_layout=args.gguf_layout, quantize_all=args.quantize_all, on_progress=bar and bar.update,
        )  # fmt: skip
    except AsrError as exc:
        return _fail(str(exc))
    finally:
        if bar is not None:
            bar.close()
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from dictation.bench import check_args, run

    try:
        check_args(args)
    except ValueError as exc:
        return _fail(str(exc))
    return run(args)


def cmd_download(args: argparse.Namespace) -> int:
    from dictation.asr import AsrError
    from dictation.asr.checkpoints.hub import download_model

    bar = _ProgressBar(args.model)
    try:
        path = download_model(args.model, on_progress=bar.update)
    except AsrError as exc:
        bar.close()
        return _fail(str(exc))
    bar.close()
    print(path)
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from dictation.audio.devices import AudioDeviceError, format_devices, list_input_devices

    try:
        print(format_devices(list_input_devices()))
    except AudioDeviceError as exc:
        return _fail(str(exc))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from dictation.doctor import main as doctor_main

    return doctor_main(as_json=args.json)


def cmd_install_desktop(args: argparse.Namespace) -> int:
    from dictation import desktop

    try:
        report = desktop.uninstall() if args.uninstall else desktop.install(systemd=args.systemd)
    except OSError as exc:
        return _fail(str(exc))
    print("\n".join(report))
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    from dictation import launch

    logging.getLogger().handlers.clear()  # the app logs to its own file, stderr and log view
    early = launch.begin()  # the hotkey and the microphone, before Qt and torch (dictation.launch)
    try:
        from dictation.app.main import run
    except ImportError as exc:
        early.close()
        from dictation import preflight

        problem = preflight.import_problem(exc)  # a system library of Qt's is missing (libEGL.so.1, ...)
        if problem:
            return preflight.refuse_to_start(problem)
        return _fail(f"the desktop app needs PySide6 (pip install PySide6-Essentials): {exc}")
    return run(verbose=args.verbose, early=early)


def cmd_remote(args: argparse.Namespace) -> int:
    """`dictation toggle|start|stop|cancel|status|quit`: one request to the running app."""
    from dictation.ipc import IpcError, NotRunning, send_command

    as_json = args.command == "status" and args.json
    try:
        reply = send_command(args.command)
    except IpcError as exc:
        if as_json:  # the socket the app would listen on, for scripts and bug reports
            running = False if isinstance(exc, NotRunning) else None  # None: there, but not answering
            print(json.dumps({"ok": False, "running": running, "message": str(exc), "socket": _socket()}))
        return _fail(str(exc))
    if not reply.get("ok"):
        return _fail(str(reply.get("message") or f"the app refused {args.command!r}"))
    if reply.get("warning"):  # e.g. a start the microphone could not honour from the press on
        print(f"dictation: warning: {reply['warning']}", file=sys.stderr)
    if args.command == "status":
        if as_json:
            print(json.dumps({**reply, "running": True, "socket": _socket()}, ensure_ascii=False))
        else:
            model = reply.get("model") or f"not loaded ({reply.get('model_state', '?')})"
            paused = " (paused)" if reply.get("hotkeys_paused") else ""
            print(f"status: {reply.get('status')}\nmodel: {model}\nhotkeys: {reply.get('hotkeys')}{paused}")
            for problem in reply.get("hotkey_problems") or ():
                print(f"hotkey problem: {problem}")
    return 0


def _socket() -> str | None:
    from dictation.ipc import IpcError, socket_path

    try:
        return socket_path()
    except IpcError:
        return None  # no private folder for it: the message says why


class _CountBar:
    """ "label [#####.....] 120/398" on stderr, for work counted in steps (tensors)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = False

    def update(self, done: int, total: int) -> None:
        width = 30
        filled = int(width * done / total) if total else 0
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


class _ProgressBar:
    """A one-line progress bar on stderr (no dependency; tqdm would be fine too)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = False

    def update(self, done: int, total: int) -> None:
        width = 30
        frac = done / total if total else 0.0
        filled = int(frac * width)
        sys.stderr.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
            f"{done / 1e9:.2f}/{total / 1e9:.2f} GB {frac * 100:5.1f}%"
        )
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


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


LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words in ([], ["-v"], ["--verbose"]):  # the app, at once: building the parser imports the
        # engine's option tables, and every millisecond before the hotkey is grabbed is one a press
        # can leak a key (dictation.launch)
        verbose = bool(words)
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT)
        return cmd_app(argparse.Namespace(command=None, verbose=verbose))
    if words[:1] == ["_match-patterns"]:  # dictation.asr.tune.patterns.CHILD_ARG
        from dictation.asr.tune import patterns

        return patterns.child_main()  # the frozen app as the regular-expression child (not a user command)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=LOG_FORMAT)
    if args.command is None:
        return cmd_app(args)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
