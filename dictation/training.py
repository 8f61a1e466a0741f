"""A personal adapter from the user's own clips: what ``dictation train-adapter`` and the
app's "Personalise" action run, around the engine's trainer (``dictation.asr.tune.train``).

The engine may not read audio files or the app's history (its layering rules), so this module does:
the samples of the corrected dictations (:func:`samples_from_history`; a :class:`Sample` names its
recording, its target ``language X<asr_text>text`` and its source), the audio of every sample,
a held-out share (``val``) scored before and after training by the engine itself, on the
full-precision base with greedy decoding (the way the user will run the adapter), and the report.

:func:`train_adapter` is safe to call from a worker thread: it reports through ``on_progress`` /
``on_status``, asks ``should_stop`` before every step and between held-out clips, and raises
:class:`TrainingError` (one line naming the file or the problem; every engine error reaches the
caller as one) or :class:`TrainingCancelled`. The output folder appears complete or not at all; a
cancelled or failed run keeps its last checkpoint in ``.<out name>.training`` beside it (0700) for
``resume``.
"""

from __future__ import annotations

import logging
import random
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dictation.asr.errors import AsrError
from dictation.asr.text.tokenizer import ASR_TEXT
from dictation.asr.tune.data import MAX_SECONDS, Sample, TrainingCancelled, TrainingError, make_sample, read_samples

if TYPE_CHECKING:
    from dictation.asr.tune.train import Progress, TrainOptions

log = logging.getLogger(__name__)

# Fewer held-out clips give no WER/CER: one clip's figure is noise ("WER 960.0% on 1 held-out clip").
# They are trained on instead, and the report says why there are no figures (``unscored``).
MIN_HELD_OUT = 3

__all__ = [
    "Progress",
    "Sample",
    "Score",
    "TrainOptions",
    "TrainReport",
    "TrainingCancelled",
    "TrainingError",
    "read_samples",
    "samples_from_history",
    "score",
    "split",
    "train_adapter",
]


def __getattr__(name: str):
    """``Progress`` and ``TrainOptions`` from the trainer, imported on first use (it imports torch;
    this module is imported by the app before any model is wanted)."""
    if name in ("Progress", "TrainOptions"):
        from dictation.asr.tune import train

        return getattr(train, name)
    raise AttributeError(name)


@dataclass(frozen=True)
class Score:
    """Word and character error rates of transcripts against their references, over ``clips`` clips."""

    wer: float
    cer: float
    clips: int

    def __str__(self) -> str:
        return f"WER {self.wer:.1%}, CER {self.cer:.1%} on {self.clips} held-out clip{'s' * (self.clips != 1)}"


@dataclass
class TrainReport:
    out: Path  # the adapter folder
    steps: int
    final_loss: float
    seconds: float  # the whole run: scoring, loading, training, writing
    tokens_per_s: float  # training alone: decoder positions (prompt and target) per second
    bits: int  # 4: trained on the NF4 base; 16: on the float base
    base_bits_per_parameter: float | None  # measured on the NF4 base's decoder projections (None for 16)
    train_clips: int
    val_clips: int
    before: Score | None = None  # the held-out clips without the adapter (None without ``val``)
    after: Score | None = None  # with it
    unscored: str = ""  # why there are no figures although ``val`` asked for some ("" otherwise)
    losses: list[float] = field(default_factory=list)


# --- samples ---------------------------------------------------------------------------------------------


def samples_from_history(path: Path | None = None) -> list[Sample]:
    """A sample of every history entry the user corrected whose recording is still there, newest
    first: the entry's text as the transcript, its language if known (one this model does not know
    is left out). Entries whose recording is gone, unreadable, empty or longer than a training clip
    may be (``MAX_SECONDS``: long dictations) are left out, with a line in the log. TrainingError if
    none is left, or the history cannot be read."""
    from dictation.asr.config import SAMPLE_RATE
    from dictation.audio.wav import load_audio_16k
    from dictation.config.history import History, HistoryError, default_path

    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise TrainingError(f"{path}: no dictation history yet")
    try:
        with History(path) as history:
            entries = history.corrected_entries()
    except HistoryError as exc:
        raise TrainingError(str(exc)) from None
    samples, left_out = [], 0
    for entry in entries:
        where = f"history entry {entry.id}"
        text = entry.text.replace(ASR_TEXT, "")  # the user's text, never read as the official format
        if entry.audio_path is None or not Path(entry.audio_path).is_file() or not text.strip():
            left_out += 1
            continue
        try:  # read here to leave out what cannot be learnt from; train_adapter reads it again
            seconds = len(load_audio_16k(entry.audio_path)) / SAMPLE_RATE
        except (AsrError, OSError, ValueError) as exc:
            log.warning("%s: recording %s unreadable (%s); left out", where, entry.audio_path, exc)
            left_out += 1
            continue
        if not 0 < seconds <= MAX_SECONDS:
            log.warning("%s: %.1f s of audio, not between 0 and %g s; left out", where, seconds, MAX_SECONDS)
            left_out += 1
            continue
        try:
            samples.append(make_sample(Path(entry.audio_path), text, entry.language, where))
        except TrainingError as exc:  # a language this model does not know: the text without it
            log.warning("%s; trained without its language", exc)
            samples.append(make_sample(Path(entry.audio_path), text, None, where))
    if not samples:
        what = "no corrected dictation has a usable recording" if left_out else "no corrected dictations yet"
        raise TrainingError(f"{path}: {what}; correct some transcripts in the History window first")
    if left_out:
        log.info("training on %d corrected dictations (%d left out)", len(samples), left_out)
    return samples


def split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training, held-out) indices of ``n`` samples: ``round(fraction * n)`` held out, at least one
    when ``fraction > 0``, drawn with ``seed`` (the same split for the same samples and seed)."""
    if not 0 <= fraction < 1:
        raise TrainingError(f"the held-out share must be at least 0 and below 1, not {fraction:g}")
    n_val = max(1, round(fraction * n)) if fraction > 0 else 0
    if n - n_val < 1:
        raise TrainingError(f"{n} clip{'s' * (n != 1)}: too few to hold {n_val} out and train on the rest")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[n_val:]), sorted(order[:n_val])


# --- scoring -------------------------------------------------------------------------------------------------


def normalise(text: str) -> str:
    """What WER/CER compare: NFKC, case-folded, punctuation and symbols removed, spaces collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)
    return re.sub(r"\s+", " ", text).strip()


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance (insertions, deletions, substitutions) between two sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def score(references: Sequence[str], hypotheses: Sequence[str]) -> Score:
    """Corpus WER (words) and CER (characters, spaces left out) of the normalised texts: the edits
    summed over all clips divided by the references' summed length."""
    words = word_errors = chars = char_errors = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        r, h = normalise(ref), normalise(hyp)
        word_errors += edit_distance(r.split(), h.split())
        words += len(r.split())
        char_errors += edit_distance(r.replace(" ", ""), h.replace(" ", ""))
        chars += len(r.replace(" ", ""))
    return Score(word_errors / max(words, 1), char_errors / max(chars, 1), len(references))


def evaluate(
    model: str,
    device: str,
    adapters: Sequence[str],
    clips,
    references: Sequence[str],
    should_stop: Callable[[], bool] | None = None,
) -> Score | None:
    """Greedy transcripts of ``clips`` by the engine (the model as the user runs it: its full-precision
    weights, with ``adapters``), scored against ``references``; None if ``should_stop()`` said True
    between two clips."""
    from dictation.asr import AsrEngine, EngineOptions

    engine = AsrEngine(EngineOptions(model=model, device=device, adapters=tuple(adapters)))
    hypotheses = []
    try:
        for audio in clips:
            if should_stop is not None and should_stop():
                return None
            hypotheses.append(engine.transcribe(audio).text)
    finally:
        engine.unload()
    return score(references, hypotheses)


# --- the run -------------------------------------------------------------------------------------------------


def train_adapter(
    model: str,
    samples: Sequence[Sample],
    out: str | Path,
    options,
    *,
    device: str = "auto",
    val: float = 0.0,
    resume: bool = False,
    on_progress: Callable | None = None,
    on_status: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainReport:
    """Train an adapter for ``model`` (a floating-point model folder or cached repo id) on ``samples``
    with ``options`` (a ``TrainOptions``) on ``device`` and write it to ``out`` (a new folder).

    ``val``: the share of the samples held out (drawn with ``options.seed``) and transcribed before
    and after. ``resume``: continue the interrupted run for ``out`` from its checkpoint (the same
    samples, settings and ``val``). ``on_progress(Progress)`` after every step; ``on_status(text)``
    at each stage. ``should_stop()`` is asked between held-out clips and before every step. Raises
    TrainingError (every problem, one line) or TrainingCancelled (``should_stop()`` said True before
    the adapter was written; a checkpoint is kept once a step was made). Stopped while the adapter
    is scored, the adapter stays and ``after`` is None."""
    import torch

    from dictation.asr.tune import train
    from dictation.asr.tune.data import load_examples
    from dictation.audio.wav import load_audio_16k

    status = on_status or (lambda text: log.info("%s", text))
    start = time.perf_counter()
    out = Path(out).expanduser().absolute()
    try:
        options.check()
        if not samples:
            raise TrainingError("no clips to train on")
        if out.exists() or out.is_symlink():
            raise TrainingError(f"{out}: already exists; choose a new output folder (nothing is overwritten)")
        train.base_model_folder(model)  # before any work
        train_ids, val_ids = split(len(samples), val, options.seed)
        unscored = ""
        if 0 < len(val_ids) < MIN_HELD_OUT:
            unscored = (
                f"no WER/CER: {len(val_ids)} held-out clip{'s' * (len(val_ids) != 1)} would give no "
                f"meaningful figure (it takes {MIN_HELD_OUT}), so all {len(samples)} clips were trained on"
            )
            train_ids, val_ids = sorted(train_ids + val_ids), []
            status(unscored)
        examples = load_examples(samples, load_audio_16k)
        references = [samples[i].text for i in val_ids]
        held_out = [examples[i].audio for i in val_ids]
        before = after = None
        if val_ids:
            status(f"transcribing {len(val_ids)} held-out clip{'s' * (len(val_ids) != 1)} without the adapter")
            before = evaluate(model, device, (), held_out, references, should_stop)
            if before is None:
                raise TrainingCancelled("training cancelled before it began; nothing was written")
            status(f"before: {before}")
        status(f"training on {len(train_ids)} clip{'s' * (len(train_ids) != 1)}")
        result = train.train_adapter(
            model,
            [examples[i] for i in train_ids],
            out,
            options,
            device=device,
            resume=resume,
            progress=on_progress,
            cancel=should_stop,
        )
        if val_ids:
            status("transcribing the held-out clips with the adapter")
            after = evaluate(model, device, (str(out),), held_out, references, should_stop)
            status(f"after: {after}" if after is not None else "scoring the adapter cancelled; the adapter is kept")
    except (TrainingError, TrainingCancelled):
        raise
    except AsrError as exc:  # the model folder, a device: the caller sees one kind of error
        raise TrainingError(str(exc)) from exc
    except torch.OutOfMemoryError:
        raise TrainingError(f"out of {device} memory transcribing the held-out clips; try --device cpu") from None
    return TrainReport(
        out=out,
        steps=len(result.losses),
        final_loss=result.losses[-1] if result.losses else float("nan"),
        seconds=time.perf_counter() - start,
        tokens_per_s=result.tokens_per_s,
        bits=options.bits,
        base_bits_per_parameter=(
            8 * result.base_bytes_per_parameter if result.base_bytes_per_parameter is not None else None
        ),
        train_clips=len(train_ids),
        val_clips=len(val_ids),
        before=before,
        after=after,
        unscored=unscored,
        losses=list(result.losses),
    )
