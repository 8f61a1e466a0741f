"""Training examples for an adapter: a JSON-lines file in the official Qwen3-ASR fine-tuning format.

One object a line::

    {"audio": "clip.wav", "text": "language English<asr_text>The transcript."}

``language None<asr_text>...`` is allowed (no language named). A plain ``"text"`` (without
``<asr_text>``) with an optional ``"language"`` key (a name or ISO code) is accepted too and becomes
``language X<asr_text>text``. Audio paths are relative to the JSON-lines file unless absolute; the
audio is read as the engine reads it (``load_audio_16k``: mono 16 kHz float32). Blank lines are
skipped.

A bad entry (not JSON, no audio or text, a missing or unreadable audio file, empty text, audio
longer than ``max_seconds``, an unknown language) raises one TrainingError naming the file, the
line and the problem; nothing is trained on a partly valid file. :func:`read_samples` reads the
file alone (a :class:`Sample` names its recording), :func:`load_examples` the audio; the app's
corrected dictations become samples too (``dictation.training``).

The engine imports nothing outside ``dictation.asr`` (but ``dictation.files``): the caller passes the
audio reader (the command line: ``dictation.audio.wav.load_audio_16k``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dictation.asr.config import SAMPLE_RATE
from dictation.asr.errors import AdapterError, AsrError
from dictation.asr.text.prompt import normalize_language
from dictation.asr.text.tokenizer import ASR_TEXT

MAX_SECONDS = 30.0  # per training clip: dictations are seconds long; attention memory grows as its square
MAX_LINE_CHARS = 1 << 20


@dataclass(frozen=True)
class Example:
    audio: np.ndarray  # 16 kHz mono float32
    target: str  # "language X<asr_text>text" (the assistant turn, without <|im_end|>)
    source: str  # "file:line", for messages

    @property
    def text(self) -> str:
        return self.target.split(ASR_TEXT, 1)[1]


def target_text(text: str, language: str | None = None) -> str:
    """The assistant turn the model is taught: ``text`` if it already has ``<asr_text>``, else
    ``language X<asr_text>text`` (X a canonical name, or None). LanguageError for an unknown one."""
    if ASR_TEXT in text:
        return text
    name = normalize_language(language)
    return f"language {name or 'None'}{ASR_TEXT}{text}"


class TrainingError(AdapterError):
    """Training cannot start or go on: bad data or settings, a missing checkpoint, memory. One line
    naming the file or the problem (an AdapterError: the adapter it was to make cannot be made)."""


class TrainingCancelled(AsrError):
    """The cancel check asked training to stop; no adapter was written (a run with a work folder keeps
    its checkpoint there for resuming)."""


@dataclass(frozen=True)
class Sample:
    """One training clip before its audio is read: the recording, the assistant turn to learn
    (``language X<asr_text>text``) and where it came from (``file:line``, ``history entry 12``)."""

    audio: Path
    target: str
    source: str

    @property
    def text(self) -> str:
        """The transcript alone (what WER/CER compare)."""
        return self.target.split(ASR_TEXT, 1)[1]


def make_sample(audio: Path, text: str, language: str | None, where: str) -> Sample:
    """A :class:`Sample` of ``text`` (official format or plain) in ``language``; TrainingError naming
    ``where`` for an unknown language, empty text or a malformed target."""
    try:
        target = target_text(text, language)
    except AsrError as exc:
        raise TrainingError(f"{where}: {exc}") from None
    head, _, spoken = target.partition(ASR_TEXT)
    if not spoken.strip():
        raise TrainingError(f"{where}: empty text")
    if not head.startswith("language ") or ASR_TEXT in spoken:
        raise TrainingError(f"{where}: text must be 'language X{ASR_TEXT}the transcript'")
    return Sample(audio, target, where)


def read_samples(path: str | os.PathLike) -> list[Sample]:
    """Every sample of a JSON-lines file (see the module docstring), without reading the audio;
    TrainingError on the first bad line."""
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TrainingError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise TrainingError(f"{path}: not UTF-8 text (expected JSON lines)") from None
    except OSError as exc:
        raise TrainingError(f"{path}: unreadable ({exc.strerror or exc})") from None
    samples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if len(line) > MAX_LINE_CHARS:
            raise TrainingError(f"{where}: line longer than {MAX_LINE_CHARS} characters")
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrainingError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(entry, dict):
            raise TrainingError(f'{where}: expected an object like {{"audio": "clip.wav", "text": "..."}}')
        audio_name, text = entry.get("audio"), entry.get("text")
        if not isinstance(audio_name, str) or not audio_name:
            raise TrainingError(f'{where}: no "audio" path')
        if not isinstance(text, str):
            raise TrainingError(f'{where}: no "text"')
        language = entry.get("language")
        if language is not None and not isinstance(language, str):
            raise TrainingError(f'{where}: "language" must be a name or code')
        audio_path = Path(audio_name).expanduser()
        if not audio_path.is_absolute():
            audio_path = path.parent / audio_path
        samples.append(make_sample(audio_path, text, language, where))
    if not samples:
        raise TrainingError(f"{path}: no examples in this file")
    return samples


def load_examples(
    samples: Sequence[Sample], load_audio: Callable[[Path], np.ndarray], max_seconds: float = MAX_SECONDS
) -> list[Example]:
    """Read every sample's audio: TrainingError naming the sample of the first missing, unreadable,
    empty or too long one. ``load_audio(path)``: mono 16-kHz float32 samples, or AsrError / OSError /
    ValueError."""
    examples = []
    for sample in samples:
        where, audio_path = sample.source, sample.audio
        if not audio_path.exists():
            raise TrainingError(f"{where}: audio file {audio_path} does not exist")
        if not audio_path.is_file():  # /dev/zero, a FIFO (reading would never end) or a folder
            raise TrainingError(
                f"{where}: audio {audio_path} is not a regular file (a device, pipe or folder); give a WAV file"
            )
        try:
            audio = load_audio(audio_path)
        except (AsrError, OSError, ValueError) as exc:
            raise TrainingError(f"{where}: audio file {audio_path} is unreadable ({exc})") from None
        seconds = len(audio) / SAMPLE_RATE
        if seconds > max_seconds:
            raise TrainingError(f"{where}: audio {audio_path} is {seconds:.1f} s long, more than {max_seconds:g} s")
        if len(audio) == 0:
            raise TrainingError(f"{where}: audio {audio_path} holds no samples")
        examples.append(Example(audio, sample.target, where))
    return examples


def read_examples(
    path: str | os.PathLike, load_audio: Callable[[Path], np.ndarray], max_seconds: float = MAX_SECONDS
) -> list[Example]:
    """Every example of a JSON-lines file with its audio read (:func:`read_samples`, :func:`load_examples`)."""
    return load_examples(read_samples(path), load_audio, max_seconds)
