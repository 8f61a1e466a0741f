"""A short take from a noise-gated microphone reaches the engine whole, in the running app.

The app decides "No speech recognised" before the engine in one place: the audio worker's speech
search (`dictation.audio.trim.find_speech`) on the saved take, whose verdict the engine worker
answers with `no_speech`. A 1.6-s take with digital silence around and inside it (a gate, a noise
suppressor with gain control) was judged silent there; `dictation transcribe` of the same file
gave text. Here the take goes through the controller, the audio, engine and history workers, and
the real engine (tiny checkpoint) must be asked to transcribe all of its sound.
"""

from __future__ import annotations

import subprocess

import numpy as np

from dictation.audio.wav import load_audio_16k
from dictation.session import Status
from tests.audio.test_trim_gated import SR, db, flatten, gate, sounding, take


def gated_report(tmp_path) -> np.ndarray:
    path = tmp_path / "report.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Please send the report today."], check=True, timeout=30)
    x = load_audio_16k(path)
    idx = np.flatnonzero(np.abs(x) > 1e-3)
    x = x[idx[0] : idx[-1] + 1]
    voice = flatten((x * db(-20) / np.sqrt(np.mean(x**2))).astype(np.float32), -20)
    samples, _, _ = take(voice, 0.3, 0.3)
    return gate(samples)


def test_a_gated_take_is_transcribed_whole(rig, qtbot, tmp_path):
    from dictation.asr import AsrEngine

    calls = []  # the samples of each transcription the app ran

    class Recording(AsrEngine):
        def transcribe(self, samples, *args, **kwargs):
            calls.append(np.array(samples, copy=True))
            return super().transcribe(samples, *args, **kwargs)

    samples = gated_report(tmp_path)
    first, last = sounding(samples)
    assert 1.5 < (last - first) / SR < 1.8 and (samples[first:last] == 0).any()  # zeros inside too
    r = rig(engine_factory=Recording)
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(samples)
    judged_silent = lambda: any("No speech" in message for _, message in r.notes)  # noqa: E731
    qtbot.waitUntil(lambda: len(calls) == 1 or judged_silent(), timeout=30_000)
    assert not judged_silent() and len(calls) == 1
    transcribed = calls[0]  # samples[start:end] of the take: it holds all of its sound
    assert len(transcribed) <= len(samples)
    assert np.count_nonzero(transcribed) == np.count_nonzero(samples)
