"""Synthesise the app's sound cues into dictation/resources/sounds/ (16-bit mono, 44.1 kHz).

    python tools/make_sounds.py [OUTPUT_DIR]

The WAVs are committed, so the app never synthesises anything at runtime; rerun this after
changing a cue and commit the result (tests/resources checks that the committed files are what
this script writes). The output is deterministic: no noise, no randomness.

The cues are short soft bell-like tones (a sine with a little second and third harmonic, a 4 ms
raised-cosine attack and an exponential decay ending in a raised-cosine fade), so they are
audible but not harsh, and start and end at zero (no clicks):

- start:  two notes rising a fourth (E5, A5): "listening"
- stop:   the same notes falling (A5, E5): "done"
- cancel: one short low note (A4) that glides down a little: "dropped"
- error:  two short low buzzes (A3 with odd harmonics): "something went wrong"
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

SAMPLE_RATE = 44_100
PEAK = 0.5  # -6 dBFS: the player scales by the user's volume from here
E5, A5, A4, A3 = 659.26, 880.0, 440.0, 220.0
OUT_DIR = Path(__file__).resolve().parent.parent / "dictation" / "resources" / "sounds"


def _envelope(n: int, attack_s: float = 0.004, decay_s: float = 0.06, release_s: float = 0.02) -> np.ndarray:
    """Raised-cosine attack, exponential decay, raised-cosine release to exactly zero."""
    t = np.arange(n) / SAMPLE_RATE
    env = np.exp(-t / decay_s)
    attack = min(n, round(attack_s * SAMPLE_RATE))
    env[:attack] *= 0.5 - 0.5 * np.cos(np.pi * np.arange(attack) / attack)
    release = min(n, round(release_s * SAMPLE_RATE))
    env[n - release :] *= 0.5 + 0.5 * np.cos(np.pi * np.arange(1, release + 1) / release)
    return env


def _tone(freq: float, seconds: float, harmonics=(1.0, 0.25, 0.08), glide: float = 1.0, **envelope) -> np.ndarray:
    """A note at ``freq`` Hz whose pitch moves to ``freq * glide`` over its length."""
    n = round(seconds * SAMPLE_RATE)
    inst = freq * np.geomspace(1.0, glide, n) if glide != 1.0 else np.full(n, freq)
    phase = 2 * np.pi * np.cumsum(inst) / SAMPLE_RATE
    wave = sum(a * np.sin(k * phase) for k, a in enumerate(harmonics, start=1))
    return wave * _envelope(n, **envelope)


def _sequence(*parts: tuple[np.ndarray, float]) -> np.ndarray:
    """Notes placed at their start times (seconds) and summed (they may overlap: a bell rings on)."""
    end = max(round(at * SAMPLE_RATE) + len(note) for note, at in parts)
    out = np.zeros(end)
    for note, at in parts:
        start = round(at * SAMPLE_RATE)
        out[start : start + len(note)] += note
    return out


def _normalise(x: np.ndarray) -> np.ndarray:
    return (PEAK * x / np.max(np.abs(x))).astype(np.float32)


def cues() -> dict[str, np.ndarray]:
    """name -> float32 samples at SAMPLE_RATE."""
    return {
        "start": _normalise(_sequence((_tone(E5, 0.09), 0.0), (_tone(A5, 0.12, decay_s=0.05), 0.07))),
        "stop": _normalise(_sequence((_tone(A5, 0.09), 0.0), (_tone(E5, 0.12, decay_s=0.05), 0.07))),
        "cancel": _normalise(_tone(A4, 0.11, glide=0.85, decay_s=0.05)),
        "error": _normalise(
            _sequence(
                (_tone(A3, 0.07, harmonics=(1.0, 0.0, 0.33, 0.0, 0.2), decay_s=0.2, release_s=0.015), 0.0),
                (_tone(A3, 0.07, harmonics=(1.0, 0.0, 0.33, 0.0, 0.2), decay_s=0.2, release_s=0.015), 0.11),
            )
        ),
    }


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from dictation.audio.wav import write_wav

    out = Path(argv[0]) if argv else OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, samples in cues().items():
        write_wav(out / f"{name}.wav", samples, SAMPLE_RATE)
        (out / f"{name}.wav").chmod(0o644)  # write_wav makes private files (recordings); these are not
        print(f"{out / name}.wav: {len(samples) / SAMPLE_RATE * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
