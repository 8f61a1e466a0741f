"""Is there speech in a take, and where: an energy detector that errs towards keeping audio.

Why: a speech model asked to transcribe silence or hum invents text ("Thank you", "[BLANK_AUDIO]"),
so a take without speech must not reach the engine; and the silence around an utterance only costs
encoder time, but cutting into it loses soft first or last sounds ("s", "f", a trailing "h").

How (a two-threshold endpoint detector in 20 ms frames):
1. The noise floor is a low percentile of the frame levels, ignoring digital zeros (a Bluetooth
   microphone waking up, a cold stream), so it adapts to the room and the microphone.
2. Speech is present where frames stand ``trigger_db`` above that floor (and above an absolute
   minimum) for at least ``min_speech_s`` in a row, short dips bridged. A steady hum or fan noise
   never rises above its own level, and a click is too short.
3. From the first and last such run the span grows outwards while frames stay ``extend_db`` above
   the floor (the fading-in "s" before a vowel, the decaying end of a word), and where sound runs
   unbroken from there to digital silence (a noise gate, a muted cue) up to it; then by a margin.
Trimming only ever removes audio outside that span; when no speech is found nothing is trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dictation.asr import SAMPLE_RATE

FRAME_S = 0.02
DIGITAL_SILENCE_DBFS = -100.0  # frames below this are zeros (or 16-bit dither), not room noise


@dataclass(frozen=True)
class SpeechSpan:
    """Where speech is, in samples: ``samples[start:end]`` keeps it with its margins."""

    has_speech: bool
    start: int
    end: int
    noise_floor_dbfs: float


def find_speech(
    samples: np.ndarray,
    sample_rate: int = SAMPLE_RATE,
    *,
    margin_start_s: float = 0.25,
    margin_end_s: float = 0.3,
    trigger_db: float = 12.0,
    extend_db: float = 6.0,
    min_level_dbfs: float = -60.0,
    min_speech_s: float = 0.1,
    max_gap_s: float = 0.04,
    floor_percentile: float = 10.0,
) -> SpeechSpan:
    """Detect speech in mono audio; without speech the span is the whole input."""
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    n = len(x)
    frame = max(1, round(FRAME_S * sample_rate))
    levels = _frame_levels(x, frame)
    live = levels[levels > DIGITAL_SILENCE_DBFS]
    if len(live) == 0:
        return SpeechSpan(False, 0, n, DIGITAL_SILENCE_DBFS)
    floor = float(np.percentile(live, floor_percentile))

    triggered = (levels >= floor + trigger_db) & (levels >= min_level_dbfs)
    triggered = _bridge_gaps(triggered, max(0, round(max_gap_s / FRAME_S)))
    min_frames = max(1, round(min_speech_s / FRAME_S))
    runs = [(a, b) for a, b in _runs(triggered) if b - a >= min_frames]
    if not runs:
        return SpeechSpan(False, 0, n, floor)

    above = _bridge_gaps(levels >= floor + extend_db, 2)
    first, last = runs[0][0], runs[-1][1]  # frames [first, last)
    while first > 0 and above[first - 1]:
        first -= 1
    while last < len(levels) and above[last]:
        last += 1
    first, last = _to_digital_silence(levels, first, last)
    start = max(0, first * frame - round(margin_start_s * sample_rate))
    end = min(n, last * frame + round(margin_end_s * sample_rate))
    return SpeechSpan(True, start, end, floor)


def transcribed_part(span: SpeechSpan, *, streamed: bool) -> tuple[int, int]:
    """The trim rule for a take: ``(start, end)`` of the samples the engine transcribes, given where
    its speech is. A take transcribed while it was recorded (``streamed``) keeps its start: that
    audio went to the engine before the release, so only its trailing silence is cut. Any other take
    loses the silence at both ends. (Without speech, ``span`` is the whole take: see `find_speech`.)"""
    return (0 if streamed else span.start), span.end


def has_speech(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bool:
    """True when the audio holds something speech-like; False for silence, hum, steady noise, clicks."""
    return find_speech(samples, sample_rate).has_speech


def trim_silence(samples: np.ndarray, sample_rate: int = SAMPLE_RATE, **options: float) -> np.ndarray:
    """The audio with leading and trailing silence removed (margins kept); unchanged if no speech."""
    span = find_speech(samples, sample_rate, **options)
    return np.asarray(samples)[span.start : span.end]


def _to_digital_silence(levels: np.ndarray, first: int, last: int) -> tuple[int, int]:
    """Grow ``[first, last)`` through sound up to digital silence, where it borders on it.

    A microphone with a noise gate, a digital source, or a cue muted by the recorder gives zeros
    around the voice and nothing else: every frame with sound in it is then speech, and the floor
    (taken from frames with sound) sits inside the speech, so the extension of step 3 stops at the
    first dip of the voice and a quiet start can fall outside the margin (44 ms of "Please" were
    cut on the virtual microphone). Where sound runs unbroken from the span to digital silence, it
    is all kept; where it runs to the take's edge (room noise), nothing changes."""
    live = levels > DIGITAL_SILENCE_DBFS
    a = first
    while a > 0 and live[a - 1]:
        a -= 1
    b = last
    while b < len(levels) and live[b]:
        b += 1
    return (a if a > 0 else first), (b if b < len(levels) else last)


def _frame_levels(x: np.ndarray, frame: int) -> np.ndarray:
    """Mean-square level of each frame in dBFS (the last, partial frame included)."""
    n_frames = -(-len(x) // frame)
    if n_frames == 0:
        return np.zeros(0)
    padded = np.zeros(n_frames * frame, dtype=np.float64)
    padded[: len(x)] = x
    blocks = padded.reshape(n_frames, frame)
    counts = np.full(n_frames, frame, dtype=np.float64)
    counts[-1] = len(x) - (n_frames - 1) * frame
    mean_square = np.einsum("ij,ij->i", blocks, blocks) / counts
    return 10.0 * np.log10(np.maximum(mean_square, 1e-12))


def _bridge_gaps(mask: np.ndarray, max_gap: int) -> np.ndarray:
    """Fill runs of False no longer than ``max_gap`` that lie between two True frames."""
    if max_gap <= 0 or not mask.any():
        return mask
    out = mask.copy()
    idx = np.flatnonzero(mask)
    gaps = np.diff(idx) - 1
    for i in np.flatnonzero((gaps > 0) & (gaps <= max_gap)):
        out[idx[i] + 1 : idx[i + 1]] = True
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))
