"""A personal adapter from the user's own clips (issue 18): ``dictation train-adapter`` and the app's
"Personalise" run this.

What the engine's ``tune/`` package cannot do by its layering rules lives here: reading the app's
history (``--from-history``: the entries the user corrected, with their saved recordings, through
``dictation.audio``), holding a share of the clips out, and scoring them before and after (word and
character error rates of greedy transcripts through the engine's public API, on the
full-precision base: the way the user will run the adapter).

The training itself, its checkpoints and the output folder are ``dictation.asr.tune.train``'s
(:func:`~dictation.asr.tune.train.train_adapter`): the adapter folder appears complete or not at
all; a cancelled or failed run keeps its checkpoint in ``.<name>.training`` beside it for
``resume``.
"""

from __future__ import annotations

import logging
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dictation.asr.errors import AdapterError, AsrError
from dictation.asr.tune.data import MAX_SECONDS, Example, target_text
from dictation.asr.tune.train import Progress, TrainingCancelled, TrainOptions

log = logging.getLogger(__name__)

Sample = Example  # one training clip: 16-kHz audio, the target turn, where it came from


class TrainingError(AdapterError):
    """Training data or settings that cannot be used; one line naming the file or entry."""


@dataclass(frozen=True)
class Score:
    """Word and character error rates of transcripts against their references."""

    wer: float
    cer: float
    clips: int

    def __str__(self) -> str:
        return f"WER {self.wer:.1%}, CER {self.cer:.1%} on {self.clips} held-out clip{'s' * (self.clips != 1)}"


@dataclass
class TrainReport:
    out: Path
    steps: int
    final_loss: float
    seconds: float
    tokens_per_s: float
    bits: int
    base_bits_per_parameter: float | None  # measured on the NF4 base's decoder linears (bits=4)
    train_clips: int
    val_clips: int
    before: Score | None = None
    after: Score | None = None
    losses: list[float] = field(default_factory=list)


# --- data ------------------------------------------------------------------------------------------


def samples_from_history(path: Path | None = None) -> list[Sample]:
    """The history entries the user corrected whose recording is still there, newest first.
    TrainingError when there are none (or the history cannot be read)."""
    from dictation.audio.wav import load_audio_16k
    from dictation.config.history import History, HistoryError, default_path

    path = Path(path) if path is not None else default_path()
    if not path.exists():
        raise TrainingError(f"{path}: no dictation history yet")
    try:
        with History(path) as history:
            entries = history.corrected_entries()
    except HistoryError as exc:
        raise TrainingError(str(exc)) from None
    samples, skipped = [], 0
    for entry in entries:
        where = f"history entry {entry.id}"
        if entry.audio_path is None or not entry.audio_path.is_file() or not entry.text.strip():
            skipped += 1
            continue
        try:
            target = target_text(entry.text.replace("<asr_text>", ""), entry.language)
            audio = load_audio_16k(entry.audio_path)
        except (AsrError, OSError, ValueError) as exc:
            raise TrainingError(f"{where} ({entry.audio_path}): {exc}") from None
        seconds = len(audio) / 16000
        if not len(audio) or seconds > MAX_SECONDS:
            log.info("%s: %.1f s of audio, not between 0 and %g s; left out", where, seconds, MAX_SECONDS)
            skipped += 1
            continue
        samples.append(Sample(audio, target, where))
    if not samples:
        what = "no corrected dictation has its recording any more" if skipped else "no corrected dictations yet"
        raise TrainingError(f"{path}: {what}; correct some transcripts in the History window first")
    if skipped:
        log.info("training on %d corrected dictations (%d without a usable recording left out)", len(samples), skipped)
    return samples


def split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training, held-out) indices: ``round(fraction * n)`` held out, at least one if ``fraction > 0``;
    chosen by ``seed``."""
    import random

    if not 0 <= fraction < 1:
        raise TrainingError(f"the held-out share must be at least 0 and below 1, not {fraction:g}")
    n_val = max(1, round(fraction * n)) if fraction > 0 else 0
    if n - n_val < 1:
        raise TrainingError(f"{n} clip{'s' * (n != 1)}: too few to hold {n_val} out and train on the rest")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[n_val:]), sorted(order[:n_val])


# --- scoring ---------------------------------------------------------------------------------------


def normalise(text: str) -> str:
    """What WER/CER compare: NFKC, case-folded, punctuation and symbols removed, spaces collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)
    return re.sub(r"\s+", " ", text).strip()


def edit_distance(a: Sequence, b: Sequence) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def score(references: Sequence[str], hypotheses: Sequence[str]) -> Score:
    """WER over words and CER over characters (spaces left out) of the normalised texts: errors
    summed over all clips divided by the references' summed length."""
    word_err = word_len = char_err = char_len = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        r, h = normalise(ref), normalise(hyp)
        word_err += edit_distance(r.split(), h.split())
        word_len += len(r.split())
        char_err += edit_distance(r.replace(" ", ""), h.replace(" ", ""))
        char_len += len(r.replace(" ", ""))
    return Score(word_err / max(word_len, 1), char_err / max(char_len, 1), len(references))


def evaluate(model: str, device: str, adapters: Sequence[str], samples: Sequence[Sample]) -> Score:
    """Greedy transcripts of ``samples`` by the engine (the full-precision base and ``adapters``), scored."""
    from dictation.asr import AsrEngine, EngineOptions

    engine = AsrEngine(EngineOptions(model=model, device=device, adapters=tuple(adapters)))
    try:
        hypotheses = [engine.transcribe(s.audio).text for s in samples]
    finally:
        engine.unload()
    return score([s.text for s in samples], hypotheses)


# --- the run ---------------------------------------------------------------------------------------


def train_adapter(
    model: str,
    samples: Sequence[Sample],
    out: str | Path,
    options: TrainOptions,
    *,
    device: str = "auto",
    val: float = 0.0,
    resume: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainReport:
    """Train an adapter for ``model`` on ``samples`` (``val``: the share held out and scored before
    and after) and write it to ``out``. Raises TrainingError / AsrError (one line) and
    TrainingCancelled (its checkpoint kept for ``resume``)."""
    from dictation.asr.checkpoints.hub import check_model_folder, resolve_model
    from dictation.asr.device import resolve_device
    from dictation.asr.tune import train

    status = on_status or (lambda text: log.info("%s", text))
    out = Path(out).expanduser().absolute()
    if out.exists():
        raise TrainingError(f"{out}: already exists; choose a new output folder (nothing is overwritten)")
    problem = check_model_folder(model)
    if problem:
        raise TrainingError(problem)
    folder = str(resolve_model(model))
    options.check()
    if not samples:
        raise TrainingError("no training clips")
    device = str(resolve_device(device))
    train_ids, val_ids = split(len(samples), val, options.seed)
    held_out = [samples[i] for i in val_ids]
    t0 = time.perf_counter()
    before = None
    if held_out:  # (on resume too: the first run's figure is not kept)
        status(f"scoring the model on {len(held_out)} held-out clip{'s' * (len(held_out) != 1)}")
        before = evaluate(folder, device, (), held_out)
        status(f"before: {before}")
    base = "NF4" if options.bits == 4 else "full-precision"
    status(f"training on {len(train_ids)} clip{'s' * (len(train_ids) != 1)} ({base} base, {device})")
    result = train.train_adapter(
        folder,
        [samples[i] for i in train_ids],
        out,
        options,
        device=device,
        resume=resume,
        progress=on_progress,
        cancel=should_stop,
    )
    bits = None if result.base_bytes_per_parameter is None else result.base_bytes_per_parameter * 8
    after = None
    if held_out:
        status("scoring the adapter on the held-out clips")
        after = evaluate(folder, device, (str(out),), held_out)
    return TrainReport(
        out=out,
        steps=len(result.losses),
        final_loss=result.losses[-1] if result.losses else float("nan"),
        seconds=time.perf_counter() - t0,
        tokens_per_s=result.tokens_per_s,
        bits=options.bits,
        base_bits_per_parameter=bits,
        train_clips=len(train_ids),
        val_clips=len(val_ids),
        before=before,
        after=after,
        losses=result.losses,
    )


__all__ = [
    "Sample",
    "Score",
    "TrainReport",
    "TrainingCancelled",
    "TrainingError",
    "samples_from_history",
    "score",
    "split",
    "train_adapter",
]
