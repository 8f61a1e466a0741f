"""Keep the app's own sound cues out of the takes: find a cue the microphone picked up, remove it.

Why: the start cue plays right after the press, while the take records (its pre-roll even begins
before the press). Through laptop speakers the microphone hears it, the silence trim takes the
chime for speech, and the speech model writes words for it. The stop cue can land in the post-roll.

How: the sound player reports when a cue starts sounding (monotonic time, with its estimate of the
output latency) and the waveform it plays; the recorder turns that time into a frame of the take
(with its own estimate of the input latency). Both estimates can be off (on the virtual PulseAudio
device of the tests the cue arrived 70 ms before the computed frame; Bluetooth adds 150-300 ms that
not every API reports), so the cue is looked for from `SEARCH_BEFORE_S` before to `SEARCH_AFTER_S`
after that frame with a matched filter: the cross-correlation with the cue gives the lag where it
sits (the lag where it explains the largest share of the audio), and the least-squares gain there
how much of the audio the cue explains (``fit``). Where it explains less than `MIN_FIT`, or its
loudest 20 ms stay under `MIN_LEVEL_DBFS` (quieter, it can neither pass the trim's absolute floor
of -60 dBFS nor be heard over a voice), the take stays exactly as recorded: headphones, a muted
speaker.

Then, by what else is there:
- The cue alone (``fit`` >= `MUTE_FIT`: the user waits for it, or says nothing): it is muted from its
  first sample to `ECHO_TAIL_S` after its last (the room's reverberation), with 5 ms fades, or less
  far where a louder sound begins in that tail (the user speaking right after the chime: the
  reverberation only decays; `echo_tail_end`). Nothing of it is left for the trim or the model, and
  what follows is kept sample for sample.
- The user talks over it (people start speaking as they press; the pre-roll exists for that): the
  cue as heard is estimated, as the played cue through a `FIR_S`-long filter (the speaker's
  colouring and the first reflections, least squares), and subtracted. The estimate lives only in
  the cue's own frequencies (a chime: a few hundred Hz around its notes), so the speech around them
  is untouched and the first word is kept; the later reverberation of the chime stays, under the
  speech. Muting here would cut the first word; subtracting everywhere would leave that
  reverberation alone in a take without speech, where the model can take it for a syllable.

`CueEraser` does this for one take, on the take's own samples as they arrive: a reader of the take
in progress (the streaming transcription) gets no frame of a cue's search window before the cue in it
has been dealt with, so what it reads and the finished take agree sample for sample.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np

SEARCH_BEFORE_S = 0.3
SEARCH_AFTER_S = 0.5
ECHO_TAIL_S = 0.1
LEAD_S = 0.02  # muted before the matched start: a cue played with a glitch (a few ms lost) starts earlier
FADE_S = 0.005
# Share of the audio's energy in the cue's span that the scaled cue must explain. Speech alone reaches
# 0.02-0.09 against the start cue (espeak-ng, five voices and languages); a cue quieter than a voice
# over it by more than ~8 dB stays (the voice masks it).
MIN_FIT = 0.15
MAX_PASSES = 3  # looks per cue: a glitch can split it into pieces
MUTE_FIT = 0.5  # from here on the cue is (nearly) alone there: muted; below, talked over: subtracted
FIR_S = 0.03  # the speaker and the room's first reflections, as a filter on the played cue
FIR_LEAD_S = 0.005  # the filter starts this much before the matched lag (a tone's correlation peaks a period apart)
RIDGE = 1e-3  # regularisation of the filter estimate (the cue is narrow-band)
MIN_LEVEL_DBFS = -66.0  # the trim's absolute floor (-60 dBFS) less a 6 dB margin
CUE_END_S = 0.05  # the cue's end as heard: what its reverberation can be as loud as
TAIL_FRAME_S = 0.01  # frames in which the echo tail is watched for the voice's onset
ONSET_RISE_DB = 10.0  # a frame this much louder than the quietest before it in the tail is a new sound
ONSET_MIN_DBFS = -60.0  # and at least this loud (the trim's absolute floor)
MIN_OVERLAP = 0.25  # at a take's end, at least this share of the cue must have been recorded
FRAME_S = 0.02


@dataclass(frozen=True)
class CueMatch:
    """Where a cue sits in a signal: ``start`` is the sample of its first sample."""

    start: int
    gain: float
    fit: float
    level_dbfs: float


def _loudest_frame_dbfs(x: np.ndarray, rate: int) -> float:
    frame = max(1, round(FRAME_S * rate))
    n = len(x) // frame * frame
    if n == 0:
        return -120.0
    blocks = x[:n].astype(np.float64).reshape(-1, frame)
    return float(10 * np.log10(max(np.max(np.mean(blocks**2, axis=1)), 1e-12)))


def locate_cue(x: np.ndarray, reference: np.ndarray, lo: int, hi: int, rate: int) -> CueMatch | None:
    """The best place for ``reference`` starting at a sample in ``[lo, hi]`` of ``x`` (the cue may run past
    the end of ``x`` by up to 1 - MIN_OVERLAP of its length), or None when the cue is not in there."""
    x = np.asarray(x, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    m, n = len(r), len(x)
    lo = max(0, lo)
    hi = min(hi, n - max(1, round(MIN_OVERLAP * m)))
    if m == 0 or hi < lo:
        return None
    segment = x[lo : min(n, hi + m)]
    size = 1 << (len(segment) + m).bit_length()
    corr = np.fft.irfft(np.fft.rfft(segment, size) * np.conj(np.fft.rfft(r, size)), size)[: hi - lo + 1]
    lags = np.arange(lo, hi + 1)
    overlap = np.minimum(m, n - lags)  # samples of the cue inside x at each lag
    ref_energy = np.concatenate([[0.0], np.cumsum(r**2)])[overlap]
    x_energy = np.concatenate([[0.0], np.cumsum(x**2)])
    seg_energy = x_energy[lags + overlap] - x_energy[lags]
    explained = np.where(ref_energy > 0, corr**2 / np.maximum(ref_energy, 1e-20), 0.0)
    # The lag where the cue explains the largest share of what is there, not the most energy: loud
    # voiced speech correlates with a chime in absolute terms more than a quiet leak does.
    fits = np.where(seg_energy > 1e-12, explained / np.maximum(seg_energy, 1e-12), 0.0)
    best = int(np.argmax(fits))
    if fits[best] <= 0:
        return None
    gain = float(corr[best] / ref_energy[best])
    return CueMatch(int(lags[best]), gain, float(fits[best]), _loudest_frame_dbfs(gain * r, rate))


def mute_envelope(length: int, start: int, end: int, rate: int) -> tuple[int, np.ndarray]:
    """Gains that are 0 in ``[start, end)`` and fade over FADE_S on either side, for the samples
    from the returned index on, clipped to ``[0, length)``."""
    fade = max(1, round(FADE_S * rate))
    down = (0.5 + 0.5 * np.cos(np.pi * np.arange(1, fade + 1) / fade)).astype(np.float32)  # ends at 0
    envelope = np.concatenate([down, np.zeros(max(0, end - start), dtype=np.float32), down[::-1]])
    first = start - fade
    lo, hi = max(0, first), min(length, first + len(envelope))
    return lo, envelope[lo - first : max(lo, hi) - first]


def echo_tail_end(x: np.ndarray, cue_end: int, rate: int) -> int:
    """Where muting after a cue that ended at ``cue_end`` stops: `ECHO_TAIL_S` later (the room's
    reverberation), or earlier where something else begins there, so that the fade is over one
    `TAIL_FRAME_S` frame before it. The reverberation only decays, and it is never louder than the
    cue's last `CUE_END_S` as heard: a tail frame louder than those, or than the quietest tail frame
    before it, by `ONSET_RISE_DB` (and over the trim's floor) is the user's voice (people speak as soon
    as the cue has sounded), and it is kept whole."""
    frame, fade = max(1, round(TAIL_FRAME_S * rate)), round(FADE_S * rate)
    limit = cue_end + round(ECHO_TAIL_S * rate)
    tail = np.asarray(x[cue_end : min(len(x), limit)], dtype=np.float64)
    before = np.asarray(x[max(0, cue_end - round(CUE_END_S * rate)) : cue_end], dtype=np.float64)
    count = len(tail) // frame
    if count == 0 or len(before) == 0:
        return limit
    energy = np.mean(tail[: count * frame].reshape(count, frame) ** 2, axis=1)
    floor = np.minimum.accumulate(np.concatenate([[np.mean(before**2)], energy]))[:-1]
    rise, audible = 10 ** (ONSET_RISE_DB / 10), 10 ** (ONSET_MIN_DBFS / 10)
    onsets = np.flatnonzero((energy > rise * floor) & (energy > audible))
    if len(onsets) == 0:
        return limit
    onset = cue_end + int(onsets[0]) * frame  # the first sample of the louder frame
    return max(cue_end, onset - frame - fade)


def heard_cue(x: np.ndarray, reference: np.ndarray, start: int, rate: int) -> tuple[int, np.ndarray]:
    """The cue as ``x`` holds it near ``start``: the least-squares fit of the reference through a
    `FIR_S` filter, as samples from the returned index on (to subtract; clipped to ``x``)."""
    r = np.asarray(reference, dtype=np.float64)
    m, taps, lead = len(r), max(1, round(FIR_S * rate)), round(FIR_LEAD_S * rate)
    first = start - lead
    span = m + taps - 1
    y = np.zeros(span)
    a, b = max(0, first), min(len(x), first + span)
    if b <= a:
        return max(0, first), np.zeros(0)
    y[a - first : b - first] = x[a:b]
    size = 1 << (span + m).bit_length()
    ref_f = np.fft.rfft(r, size)
    auto = np.fft.irfft(np.abs(ref_f) ** 2, size)[:taps]  # the filter's normal equations: Toeplitz
    cross = np.fft.irfft(np.fft.rfft(y, size) * np.conj(ref_f), size)[:taps]
    auto[0] *= 1.0 + RIDGE
    estimate = np.convolve(r, solve_toeplitz(auto, cross))[:span]
    return a, estimate[a - first : b - first]


def solve_toeplitz(column: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve T x = rhs for the symmetric positive definite Toeplitz matrix T with first column
    ``column`` (Levinson recursion: O(n²) in small vector steps, a few ms for n = 480, where a dense
    solve takes tens to hundreds of ms on a busy machine)."""
    r = np.asarray(column, dtype=np.float64)
    y = np.asarray(rhs, dtype=np.float64)
    n = len(y)
    forward, x, new = np.zeros(n), np.zeros(n), np.empty(n)
    forward[0], x[0] = 1.0 / r[0], y[0] / r[0]
    for k in range(1, n):
        lagged = r[k:0:-1]  # r[k], ..., r[1]
        error = float(lagged @ forward[:k])
        new[:k] = forward[:k]
        new[k] = 0.0
        new[1 : k + 1] -= error * forward[k - 1 :: -1]
        forward[: k + 1] = new[: k + 1] / (1.0 - error * error)
        x[: k + 1] += (y[k] - float(lagged @ x[:k])) * forward[k::-1]
    return x


class TapeLike(Protocol):
    """The take as the recorder holds it: ``frames`` so far, a copy from a frame on, changed in place."""

    frames: int

    def read(self, start: int) -> np.ndarray: ...

    def apply_gain(self, start: int, gains: np.ndarray) -> None: ...

    def add(self, start: int, values: np.ndarray) -> None: ...


@dataclass
class _Cue:
    expected: int  # the take's frame where the cue should start, from the reported time
    reference: np.ndarray  # the cue as played, at the take's rate


@dataclass(frozen=True)
class _Edit:
    start: int  # first frame of the take it changes
    values: np.ndarray  # gains (mute) or values to add (subtract)
    mute: bool


class CueEraser:
    """The cues played during one take. The recorder calls `add` and `collect` / `apply` /
    `readable` under its own lock, and `plan` (the arithmetic, up to tens of ms) outside it, holding
    ``lock`` from `collect` to `apply` so that a `settle` at the end of the take waits for it."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.pending: list[_Cue] = []
        self.muted: list[tuple[int, int]] = []  # [start, end) frames of the take
        self.subtracted: list[tuple[int, int]] = []  # [start, end) where it was talked over
        self.handed_out = 0  # frames a reader has already been given: never changed afterwards
        self.lock = threading.Lock()

    def add(self, expected_frame: int, reference: np.ndarray) -> None:
        if len(reference):
            self.pending.append(_Cue(expected_frame, np.asarray(reference, dtype=np.float32)))

    def _window(self, cue: _Cue) -> tuple[int, int, int]:
        lo = max(self.handed_out, cue.expected - round(SEARCH_BEFORE_S * self.rate))
        hi = cue.expected + round(SEARCH_AFTER_S * self.rate)
        needed = hi + len(cue.reference) + round((ECHO_TAIL_S + FADE_S) * self.rate)
        return lo, hi, needed

    def hold(self) -> int | None:
        """The first frame a reader must not be given yet (a pending cue's search window), or None."""
        starts = [self._window(cue)[0] for cue in self.pending]
        return min(starts) if starts else None

    def collect(self, tape: TapeLike, final: bool = False) -> list[tuple[_Cue, int, np.ndarray]]:
        """Take out the cues whose whole search window has been recorded (all of them when ``final``),
        each with the audio it needs: (cue, first frame, the take from there on)."""
        work = []
        for cue in list(self.pending):
            lo, _hi, needed = self._window(cue)
            if final or tape.frames >= needed:
                self.pending.remove(cue)
                first = max(0, lo - round(FADE_S * self.rate))
                work.append((cue, first, tape.read(first)))
        return work

    def plan(self, cue: _Cue, first: int, x: np.ndarray) -> list[_Edit]:
        """What to change for one cue (pure arithmetic on ``x``, the take from frame ``first`` on).

        Up to `MAX_PASSES` looks: a cue played with a glitch (an output underrun inserts a gap)
        reaches the take in pieces, and a piece next to a muted one is muted with it."""
        lo, hi, _needed = self._window(cue)
        m, rate = len(cue.reference), self.rate
        y = np.array(x, dtype=np.float32)
        edits: list[_Edit] = []
        muted: list[tuple[int, int]] = []
        for _ in range(MAX_PASSES):
            match = locate_cue(y, cue.reference, lo - first, hi - first, rate)
            if match is None or match.fit < MIN_FIT or match.level_dbfs < MIN_LEVEL_DBFS:
                break
            piece = any(a - m <= match.start <= b for a, b in muted)
            if match.fit >= MUTE_FIT or piece:
                start, end = match.start - round(LEAD_S * rate), echo_tail_end(y, match.start + m, rate)
                at, values = mute_envelope(len(y), start, end, rate)
                y[at : at + len(values)] *= values
                muted.append((start, end))
            else:
                at, estimate = heard_cue(y, cue.reference, match.start, rate)
                values = -estimate.astype(np.float32)
                y[at : at + len(values)] += values
            edits.append(_Edit(first + at, values, mute=match.fit >= MUTE_FIT or piece))
        return edits

    def apply(self, tape: TapeLike, edits: list[_Edit]) -> None:
        for edit in edits:
            skip = max(0, self.handed_out - edit.start)  # what a reader has is never changed
            start, values = edit.start + skip, edit.values[skip:]
            if edit.mute:
                tape.apply_gain(start, values)
            else:
                tape.add(start, values)
            (self.muted if edit.mute else self.subtracted).append((start, min(start + len(values), tape.frames)))

    def settle(self, tape: TapeLike, final: bool = False) -> int | None:
        """Find and remove every cue whose search window has been recorded (every cue when ``final``),
        all at once; returns `hold`."""
        with self.lock:
            self.apply(tape, [edit for work in self.collect(tape, final) for edit in self.plan(*work)])
        return self.hold()

    def readable(self, tape: TapeLike, start: int) -> np.ndarray:
        """The take from frame ``start`` on, up to `hold`; remembers what was handed out."""
        hold = self.hold()
        samples = tape.read(start)
        if hold is not None:
            samples = samples[: max(0, hold - start)]
        self.handed_out = max(self.handed_out, start + len(samples))
        return samples
