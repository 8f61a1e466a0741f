"""Is there speech in a take, and where: an energy detector that errs towards keeping audio.

Why: a speech model asked to transcribe silence or hum invents text ("Thank you", "[BLANK_AUDIO]"),
so a take without speech must not reach the engine; and the silence around an utterance only costs
encoder time, but cutting into it loses soft first or last sounds ("s", "f", a trailing "h").

How (a two-threshold endpoint detector in 20 ms frames):
1. The noise floor comes from the room: the sound that reaches an edge of the take (runs of
   digital zeros, from a Bluetooth microphone waking up, a cold stream or a muted cue, are left
   out, and so is sound shorter than ``min_speech_s`` at an edge). It is a low percentile of those
   frames' levels, or the quietest 60 ms of them if lower (a short take that speech fills has
   little room in it: the gap between two words, a short lead).
1b. No sound reaches an edge (a noise gate or noise suppression: zeros around the voice and
   between its words): then the floor is digital silence and all the sound passed the gate. It is
   speech when ``min_speech_s`` of it reaches the absolute minimum and either the gate opened
   more than once or its level varies (`GATED_SPREAD_DB`: steady noise between two muted cues
   does not); the span is all of it.
2. Speech is present where frames stand ``trigger_db`` above that floor (and above an absolute
   minimum) for at least ``min_speech_s`` in a row, short dips bridged. A steady hum or fan noise
   never rises above its own level, and a click is too short.
3. From the first and last such run the span grows outwards while frames stay ``extend_db`` above
   the floor (the fading-in "s" before a vowel, the decaying end of a word), and where sound runs
   unbroken from there to digital silence (a noise gate, a muted cue) up to it, and on across
   gaps of zeros up to 0.5 s (a gate closing between words); then by a margin.
4. When in doubt, keep: with no run found, a sound beside digital silence that reaches the
   absolute minimum and varies by ``trigger_db`` (a gated voice open at the take's edge, which set
   the floor itself) makes the whole take count as speech, untrimmed.
Trimming only ever removes audio outside that span; when no speech is found nothing is trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dictation.asr import SAMPLE_RATE

FRAME_S = 0.02
DIGITAL_SILENCE_DBFS = -100.0  # frames below this are zeros (or 16-bit dither), not room noise
GATE_GAP_FRAMES = 25  # 0.5 s: digital silence this short between sounds is a gate closing between words
GATED_SPREAD_DB = 3.0  # a voice through a gate varies more than this (flattened by a gain control: 4+ dB);
# steady room noise between two muted cues varies by 1-2 dB
QUIET_STRETCH_FRAMES = 3  # 60 ms: the shortest stretch of room the noise floor may come from


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
    live = levels > DIGITAL_SILENCE_DBFS
    if not live.any():
        return SpeechSpan(False, 0, n, DIGITAL_SILENCE_DBFS)
    min_frames = max(1, round(min_speech_s / FRAME_S))
    max_gap = max(0, round(max_gap_s / FRAME_S))

    def found(first: int, last: int, floor: float) -> SpeechSpan:  # frames [first, last), margins added
        start = max(0, first * frame - round(margin_start_s * sample_rate))
        end = min(n, last * frame + round(margin_end_s * sample_rate))
        return SpeechSpan(True, start, end, floor)

    segments = _runs(live)  # the sound between digital silences
    room = [(a, b) for a, b in segments if (a == 0 or b == len(levels)) and b - a >= min_frames]
    if not room:  # step 1b: a gate
        opened = [seg for seg in segments if _loud_for(levels[seg[0] : seg[1]], min_level_dbfs, min_frames, max_gap)]
        if len(opened) > 1 or (opened and _level_spread(levels, segments) >= GATED_SPREAD_DB):
            return found(segments[0][0], segments[-1][1], DIGITAL_SILENCE_DBFS)
        return SpeechSpan(False, 0, n, DIGITAL_SILENCE_DBFS)
    floor = min(
        _quietest_stretch(levels, room, QUIET_STRETCH_FRAMES),
        float(np.percentile(np.concatenate([levels[a:b] for a, b in room]), floor_percentile)),
    )

    triggered = (levels >= floor + trigger_db) & (levels >= min_level_dbfs)
    runs = [(a, b) for a, b in _runs(_bridge_gaps(triggered, max_gap)) if b - a >= min_frames]
    if not runs:
        if _gated_voice(levels, segments, min_level_dbfs, min_frames, max_gap, trigger_db):  # step 4
            return found(0, len(levels), floor)
        return SpeechSpan(False, 0, n, floor)

    above = _bridge_gaps(levels >= floor + extend_db, 2)
    first, last = runs[0][0], runs[-1][1]  # frames [first, last)
    while first > 0 and above[first - 1]:
        first -= 1
    while last < len(levels) and above[last]:
        last += 1
    first, last = _to_digital_silence(levels, first, last)
    return found(first, last, floor)


def _loud_for(levels: np.ndarray, min_level_dbfs: float, min_frames: int, max_gap: int) -> bool:
    """Do ``min_frames`` frames in a row (dips up to ``max_gap`` bridged) reach the absolute minimum?"""
    loud = _bridge_gaps(levels >= min_level_dbfs, max_gap)
    return any(b - a >= min_frames for a, b in _runs(loud))


def _level_spread(levels: np.ndarray, segments: list[tuple[int, int]]) -> float:
    """How much the level varies within the sound (10th to 90th percentile, dB), leaving out the
    first and last frame of each segment (a gate's or a mute's fade)."""
    inner = [levels[a + 1 : b - 1] for a, b in segments if b - a > 2]
    if not inner:
        return 0.0
    p10, p90 = np.percentile(np.concatenate(inner), [10, 90])
    return float(p90 - p10)


def _quietest_stretch(levels: np.ndarray, segments: list[tuple[int, int]], width: int) -> float:
    """The lowest mean level (dB) of ``width`` frames in a row within the segments: the room between
    two words, or in a short lead, where speech fills most of a take and so its low percentile."""
    lowest = np.inf
    for a, b in segments:
        if b - a >= width:
            lowest = min(lowest, float(np.convolve(levels[a:b], np.ones(width) / width, "valid").min()))
    return lowest


def _gated_voice(
    levels: np.ndarray,
    segments: list[tuple[int, int]],
    min_level_dbfs: float,
    min_frames: int,
    max_gap: int,
    spread_db: float,
) -> bool:
    """Step 4: is there a sound that a gate let through, which the floor of step 1 may have hidden?

    A segment of sound that borders on digital silence, with ``min_frames`` above the absolute
    minimum, whose level varies by ``spread_db`` or more (10th to 90th percentile of its frames).
    A gated microphone's speech running to the take's edge (the voice began at the press) sets the
    floor of step 1 itself, and a compressed voice (a noise suppressor's gain control) rises too
    little above it. Steady noise next to a muted cue or a waking microphone varies by a decibel or
    two and is not taken for it."""
    for a, b in segments:
        if a == 0 and b == len(levels):
            continue  # sound from the first frame to the last: no gate, step 1 holds
        seg = levels[a:b]
        if not _loud_for(seg, min_level_dbfs, min_frames, max_gap):
            continue
        p10, p90 = np.percentile(seg, [10, 90])
        if p90 - p10 >= spread_db:
            return True
    return False


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
    """Grow ``[first, last)`` through sound up to digital silence, where it borders on it, and on
    across gaps of digital silence up to `GATE_GAP_FRAMES` long to the sound beyond them.

    A microphone with a noise gate, a digital source, or a cue muted by the recorder gives zeros
    around the voice and nothing else: every frame with sound in it is then speech, and the floor
    (taken from frames with sound) sits inside the speech, so the extension of step 3 stops at the
    first dip of the voice and a quiet start can fall outside the margin (44 ms of "Please" were
    cut on the virtual microphone). A gate also closes between words, so the words before the
    first loud one lie beyond a short gap of zeros. Where sound runs unbroken from the span to
    digital silence, it is all kept, with what lies beyond a short gap; where it runs to the take's
    edge without such a gap (room noise), nothing changes."""
    live = levels > DIGITAL_SILENCE_DBFS
    n = len(levels)

    def grow(i: int, step: int) -> tuple[int, bool]:  # i: the first frame outside, in that direction
        jumped = False
        while 0 <= i < n:
            if live[i]:
                i += step
                continue
            j = i
            while 0 <= j < n and not live[j] and abs(j - i) < GATE_GAP_FRAMES:
                j += step
            if not (0 <= j < n) or not live[j]:
                return i, True  # a long silence, or silence to the take's edge: the gate was closed
            i, jumped = j, True
        return i, jumped

    a, a_gate = grow(first - 1, -1)
    b, b_gate = grow(last, 1)
    return (a + 1 if a_gate else first), (b if b_gate else last)


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
