"""The real Recorder on a real (virtual) microphone: nothing from the press on is lost.

A reference signal (silence, then noise-like audio with a sharp onset) plays into the virtual sink.
As soon as the recorder's level meter shows the onset, the key is "pressed". The onset therefore
reached the app before the press, so the take must contain it, preceded by up to ``pre_roll_s`` of
the silence before it, and from there on be a sample-exact copy of what was played (a lost, doubled
or reordered block at the ring-to-take hand-over would break the correlation). The take's first
sample then lies at least as far before the press as it lies before the onset: that is the
press-to-first-sample gap this test measures (negative = audio from before the press is kept).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from dictation.audio.capture import Recorder
from dictation.audio.wav import write_wav
from tests.waiting import wait_until

SR = 16_000
PRE_ROLL_S = 0.4
POST_ROLL_S = 0.2
log = logging.getLogger(__name__)


def reference_signal(seconds: float = 2.0) -> np.ndarray:
    """Band-limited noise (up to ~4 kHz) at -16 dBFS RMS: every stretch of it is unique."""
    rng = np.random.default_rng(7)
    x = np.convolve(rng.standard_normal(round(seconds * SR) + 7), np.ones(4) / 2, mode="valid")[: round(seconds * SR)]
    return (0.16 * x / np.sqrt(np.mean(x**2))).astype(np.float32)


def test_real_microphone_take_starts_before_the_press(virtual_mic, tmp_path):
    signal = reference_signal()
    wav = tmp_path / "reference.wav"
    write_wav(wav, np.concatenate([np.zeros(SR // 4, dtype=np.float32), signal]), SR)
    # write_wav stores 16-bit PCM: compare against exactly what is played
    signal = np.round(signal * 32768) / 32768

    recorder = Recorder(None, pre_roll_s=PRE_ROLL_S, post_roll_s=POST_ROLL_S)
    recorder.open()
    player = None
    try:
        # Warm: the ring holds more than the pre-roll of (silent) microphone audio.
        wait_until(lambda: recorder.frames_delivered > 0.6 * SR, 10, "the microphone stream to deliver 0.6 s")
        assert recorder.level() < -80, "the virtual microphone is not silent before playback"
        player = virtual_mic.play(wav)
        wait_until(lambda: recorder.level() > -40, 15, "the played audio to reach the recorder", interval=0.002)
        t_press = time.monotonic()
        recorder.start(t_press)
        wait_until(lambda: recorder.elapsed_s() >= 1.2, 10, "1.2 s of recording")
        t_release = time.monotonic()
        take = recorder.stop(t_release)
    finally:
        recorder.close()
        if player is not None:
            player.terminate()
            player.wait(timeout=20)

    assert take.error is None, take.error
    assert take.device_sample_rate == SR, "the virtual microphone should open at 16 kHz directly"
    assert not take.silent
    x = take.samples.astype(np.float64)

    # Where does the played signal begin in the take? Correlate with its first 0.25 s.
    head = signal[: SR // 4].astype(np.float64)
    corr = np.correlate(x[: round(1.5 * SR)], head, mode="valid")
    onset = int(np.argmax(corr))
    lead_s = onset / SR
    played = x[onset : onset + len(signal)]
    ref = signal[: len(played)]
    log.info(
        "virtual mic: take %.3f s, onset %.1f ms into the take (pre-roll %.0f ms), "
        "recorder's start gap %.1f ms, press->release %.3f s, max deviation %.5f",
        take.duration_s,
        lead_s * 1000,
        PRE_ROLL_S * 1000,
        (take.start_gap_s or 0) * 1000,
        t_release - t_press,
        np.max(np.abs(played - ref)),
    )
    # The onset was heard before the press, so the take begins at least lead_s before the press:
    # the press-to-first-sample gap is <= -lead_s. The start is the press's frame minus the
    # pre-roll, and the press's frame is at or after the onset's: lead_s <= pre-roll (+1 frame).
    # The lower bound leaves 300 ms for the level poll and scheduling on a loaded machine.
    assert 0.1 <= lead_s <= PRE_ROLL_S + 1 / SR, f"onset at {lead_s * 1000:.1f} ms into the take"
    assert np.sqrt(np.mean(x[:onset] ** 2)) < 1e-3, "the pre-roll should be the silence before the onset"
    assert take.start_gap_s is not None and take.start_gap_s <= -0.1

    # From the onset on the take is what was played, block for block (PulseAudio does not resample
    # here: the sink, the source and the stream are all 16 kHz mono).
    similarity = float(np.dot(played, ref) / (np.linalg.norm(played) * np.linalg.norm(ref)))
    assert similarity > 0.99, f"the take does not match what was played (correlation {similarity:.3f})"
    assert np.max(np.abs(played - ref)) < 0.005

    # Nothing at the end is lost either: the take runs to post_roll after the release.
    expected = lead_s + (t_release - t_press) + POST_ROLL_S
    assert take.duration_s >= expected - 0.1, f"take {take.duration_s:.3f} s, expected about {expected:.3f} s"
