"""The engine's subcommands: `dictation transcribe`, `download`, `quantize`, `merge-lora`,
`train-adapter`, `convert` and `bench`. torch and the engine are imported inside each command, so the
command line starts without them (tests/test_imports.py)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from dictation.cli.terminal import CountBar, ProgressBar, TranscribeProgress, fail


def cmd_transcribe(args: argparse.Namespace) -> int:
    from dictation.asr import SAMPLE_RATE, AsrEngine, AsrError, EngineOptions, limits
    from dictation.asr.engine import is_silent
    from dictation.asr.text.prompt import normalize_language
    from dictation.audio.wav import load_audio_16k

    try:
        normalize_language(args.language)
    except AsrError as exc:
        return fail(str(exc))
    problem = limits.check_max_new_tokens(args.max_new_tokens)
    if problem:
        return fail(f"--max-new-tokens: {problem}")
    context = args.context or ""
    if args.vocabulary:  # the app's: the user's own text, then the words learned from corrections
        from dictation.config.store import SettingsStore
        from dictation.vocabulary import model_context

        context = "\n".join(part for part in (model_context(SettingsStore().load().transcription), context) if part)
    problem = limits.check_context(context)
    if problem:
        return fail(f"{'--vocabulary with ' if args.vocabulary else ''}--context: {problem}")

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
            fail(str(exc))
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
            map_weights="all",  # one process per run: the load weighs more than a decode step
        )
    )
    import torch

    try:
        engine.prepare()
    except AsrError as exc:
        return fail(str(exc))
    except torch.OutOfMemoryError:
        return fail(
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
            fail(f"{name}: {exc}")
            continue
        except torch.OutOfMemoryError:
            failed += 1
            fail(f"{name}: out of memory while transcribing; try a shorter clip or --device cpu")
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


def cmd_quantize(args: argparse.Namespace) -> int:
    from dictation.asr import AsrError
    from dictation.asr.checkpoints.hub import resolve_model
    from dictation.asr.nn.quant_format import DEFAULT_GROUP_SIZE
    from dictation.asr.tune.writers import write_quantized_folder

    bar = CountBar(f"quantizing to {args.variant}") if sys.stderr.isatty() else None
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
        return fail(str(exc))
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
        return fail(str(exc))
    print(out)
    return 0


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
        return fail(f"{exc}; the same command with --resume goes on")
    except AsrError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return fail("training interrupted; no adapter was written (a checkpoint saved before is kept for --resume)")
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

    bar = CountBar(f"converting to {args.to}") if sys.stderr.isatty() else None
    try:
        paths = convert(
            args.model, args.to, Path(args.out), adapters=args.adapter or (), type_name=args.type,
            gguf_layout=args.gguf_layout, quantize_all=args.quantize_all, on_progress=bar and bar.update,
        )  # fmt: skip
    except AsrError as exc:
        return fail(str(exc))
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
        return fail(str(exc))
    return run(args)


def cmd_download(args: argparse.Namespace) -> int:
    from dictation.asr import AsrError
    from dictation.asr.checkpoints.hub import download_model

    bar = ProgressBar(args.model)
    try:
        path = download_model(args.model, on_progress=bar.update)
    except AsrError as exc:
        bar.close()
        return fail(str(exc))
    bar.close()
    print(path)
    return 0
