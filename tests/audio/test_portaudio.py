"""PortAudio called directly for the microphone opened at launch (`dictation.audio.portaudio`): on
the real (virtual) microphone it records without sounddevice or numpy, the Recorder that takes it
over keeps what was played sample for sample, and its hold on PortAudio is dropped for a rescan."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from dictation.audio import devices, portaudio
from dictation.audio.capture import Recorder
from dictation.audio.early_stream import EarlyInputBackend, EarlyStream
from dictation.audio.wav import write_wav
from tests.audio.test_virtual_mic import reference_signal

SR = 16_000

CHILD = """
import json, sys, time
from dictation.audio.early_stream import EarlyStream
stream = EarlyStream()
stream.open(None)
deadline = time.monotonic() + 10
while stream._held_frames < 0.3 * stream.rate and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({
    "sounddevice": "sounddevice" in sys.modules, "numpy": "numpy" in sys.modules,
    "raw": type(stream._stream).__module__ + "." + type(stream._stream).__name__,
    "rate": stream.rate, "channels": stream.channels, "held": stream._held_frames,
}))
stream.close()
"""


def test_the_launch_microphone_records_without_sounddevice_or_numpy(pulse_server):
    env = {**pulse_server.env, "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["raw"] == "dictation.audio.portaudio.RawInputStream"
    assert not seen["sounddevice"] and not seen["numpy"], seen
    assert (seen["rate"], seen["channels"]) == (SR, 1)
    assert seen["held"] >= 0.3 * SR


def test_the_recorder_keeps_what_the_direct_stream_heard_before_it_took_over(virtual_mic, tmp_path):
    signal = reference_signal(1.0)
    wav = tmp_path / "reference.wav"
    write_wav(wav, np.concatenate([np.zeros(SR // 4, dtype=np.float32), signal]), SR)
    signal = np.round(signal * 32768) / 32768  # what 16-bit PCM plays

    stream = EarlyStream()
    stream.open(None)
    assert isinstance(stream._stream, portaudio.RawInputStream)
    t_before = time.monotonic()
    player = virtual_mic.play(wav)
    player.wait(timeout=20)
    time.sleep(0.3)  # the sink's last blocks
    recorder = Recorder(None, pre_roll_s=0.0, post_roll_s=0.0, backend=EarlyInputBackend(stream))
    try:
        recorder.open()  # takes the running stream over, with everything it held
        assert recorder._live is not None and recorder._live.stream is stream
        recorder.start(t_before)
        take = recorder.stop(time.monotonic())
    finally:
        recorder.close()
    assert not stream.is_open  # closed with the recorder

    assert take.error is None, take.error
    assert take.device_sample_rate == SR
    x = take.samples.astype(np.float64)
    head = signal[: SR // 4].astype(np.float64)
    onset = int(np.argmax(np.correlate(x, head, mode="valid")))
    played = x[onset : onset + len(signal)]
    assert len(played) == len(signal), f"the take holds {len(played)} of {len(signal)} samples after the onset"
    assert np.max(np.abs(played - signal)) < 0.005


def test_a_device_it_does_not_have_is_a_portaudio_error(virtual_mic):
    pa = portaudio.load()
    assert pa is not None
    with pytest.raises(portaudio.PortAudioError):
        pa.RawInputStream(
            device=10_000, samplerate=SR, channels=1, blocksize=320, callback=print, finished_callback=print
        )
    default = pa.query_devices(kind="input")
    with pytest.raises(ValueError, match="input channel"):
        pa.RawInputStream(
            device=default["index"],
            samplerate=SR,
            channels=default["max_input_channels"] + 1,
            blocksize=320,
            callback=print,
            finished_callback=print,
        )


class CountingLibrary:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def Pa_Terminate(self) -> int:  # noqa: N802 (PortAudio's name)
        self.calls.append("Pa_Terminate")
        return 0


def test_a_rescan_first_drops_the_launch_hold_so_portaudio_really_restarts(monkeypatch):
    """PortAudio counts its initialisations: with the launch's hold kept, sounddevice's terminate
    would only count down and the rescan would list the old devices."""
    library = CountingLibrary()
    monkeypatch.setattr(portaudio, "_loaded", portaudio.PortAudio(None, library))
    sd = type("FakeSoundDevice", (), {"PortAudioError": RuntimeError})()
    sd._terminate = lambda: library.calls.append("sounddevice terminate")
    sd._initialize = lambda: library.calls.append("sounddevice initialize")
    monkeypatch.setattr(devices, "import_sounddevice", lambda: sd)

    devices.rescan_devices()
    assert library.calls == ["Pa_Terminate", "sounddevice terminate", "sounddevice initialize"]
    devices.rescan_devices()  # the hold is dropped once
    assert library.calls.count("Pa_Terminate") == 1
    assert portaudio._loaded is None
