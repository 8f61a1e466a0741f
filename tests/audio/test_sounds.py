"""Sound cues: never in the caller's way, the right cue at the right loudness, on a real device too.

Most tests use a fake output that records what it was asked to play (and can be made to block, as a
slow device does). The last test plays through PortAudio into the virtual PulseAudio sink and
records the sink's monitor (the virtual microphone), so the cue must really arrive.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from dictation import resources
from dictation.audio import sounds
from dictation.audio.sounds import SoundPlayer, SoundUnavailable
from dictation.audio.wav import read_wav
from dictation.session import Sound
from tests.waiting import wait_until


class FakeOutput:
    """Records each played cue; ``rate`` is what the 'device' accepts; ``gate`` blocks play()."""

    def __init__(self, rate: int = 44_100, error: Exception | None = None):
        self.rate, self.error = rate, error
        self.played: list[tuple[np.ndarray, int]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def output_rate(self, preferred: int) -> int:
        if self.error is not None:
            raise self.error
        return self.rate

    def play(self, samples: np.ndarray, sample_rate: int, stop: threading.Event | None = None, *, on_start=None):
        self.entered.set()
        if on_start is not None:
            on_start(time.monotonic())
        if self.gate is not None:
            assert self.gate.wait(10), "test never opened the gate"
        self.played.append((samples, sample_rate))


def cue(name: str) -> np.ndarray:
    return read_wav(resources.sound_path(name))[0]


def dominant_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x)), 1 << 16))
    return float(np.fft.rfftfreq(1 << 16, 1 / rate)[np.argmax(spectrum)])


@pytest.fixture
def player_factory():
    players = []

    def make(backend, **kwargs):
        player = SoundPlayer(backend=backend, **kwargs)
        players.append(player)
        return player

    yield make
    for player in players:
        player.close()


def test_each_cue_plays_its_own_sound_at_full_volume(player_factory):
    out = FakeOutput()
    player = player_factory(out, volume=100)
    for kind in ("start", "stop", "cancel", "error"):
        player.play(kind)
        assert player.drain()
    assert [len(samples) for samples, _ in out.played] == [len(cue(k)) for k in ("start", "stop", "cancel", "error")]
    for (samples, rate), kind in zip(out.played, ("start", "stop", "cancel", "error"), strict=True):
        assert rate == 44_100
        np.testing.assert_array_equal(samples, cue(kind))


def test_session_sound_values_are_accepted(player_factory):
    out = FakeOutput()
    player = player_factory(out, volume=100)
    player.play(Sound.CANCEL)
    assert player.drain()
    np.testing.assert_array_equal(out.played[0][0], cue("cancel"))


@pytest.mark.parametrize("volume, gain", [(100, 1.0), (50, 0.25), (10, 0.01)])
def test_volume_is_perceptual(player_factory, volume, gain):
    out = FakeOutput()
    player = player_factory(out, volume=volume)
    player.play("start")
    assert player.drain()
    np.testing.assert_allclose(out.played[0][0], cue("start") * gain, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("settings", [{"volume": 0}, {"volume": 80, "enabled": False}])
def test_muted_or_disabled_plays_nothing_and_opens_nothing(player_factory, settings):
    out = FakeOutput()
    player = player_factory(out, **settings)
    player.play("start")
    assert player.drain()
    assert out.played == [] and not out.entered.is_set()


def test_changing_volume_and_enabled_applies_to_the_next_cue(player_factory):
    out = FakeOutput()
    player = player_factory(out, volume=100, enabled=False)
    player.play("stop")
    player.enabled, player.volume = True, 150  # clamped to 100
    player.play("stop")
    player.volume = -5  # clamped to 0: silent
    player.play("stop")
    assert player.drain()
    assert len(out.played) == 1 and player.volume == 0
    np.testing.assert_array_equal(out.played[0][0], cue("stop"))


def test_a_device_without_44k1_gets_the_cue_resampled(player_factory):
    out = FakeOutput(rate=48_000)
    player = player_factory(out, volume=100)
    player.play("start")
    assert player.drain()
    samples, rate = out.played[0]
    assert rate == 48_000
    assert abs(len(samples) - len(cue("start")) * 48_000 / 44_100) <= 1
    # the same notes at the new rate (E5 then A5), not sped up
    half = len(samples) // 2
    assert abs(dominant_hz(samples[:half], rate) - 659.3) < 5
    assert abs(dominant_hz(samples[half:], rate) - 880.0) < 5


def test_play_returns_at_once_while_the_device_is_slow(player_factory):
    out = FakeOutput()
    out.gate = threading.Event()
    player = player_factory(out, volume=100)
    t0 = time.perf_counter()
    player.play("start")
    assert out.entered.wait(5)  # the worker is now stuck in the 'device'
    t1 = time.perf_counter()
    player.play("stop")
    t2 = time.perf_counter()
    assert t2 - t1 < 0.05, "play() waited for the device"  # it would wait until the gate opens
    assert t1 - t0 < 5
    assert not player.drain(timeout=0.05)  # still playing
    out.gate.set()
    assert player.drain()
    assert len(out.played) == 2


def test_only_the_newest_of_queued_cues_is_played(player_factory):
    """start, then cancel while the device is still busy with an earlier cue: no stale start."""
    out = FakeOutput()
    out.gate = threading.Event()
    player = player_factory(out, volume=100)
    player.play("error")
    assert out.entered.wait(5)
    player.play("start")
    player.play("cancel")
    out.gate.set()
    assert player.drain()
    assert [len(samples) for samples, _ in out.played] == [len(cue("error")), len(cue("cancel"))]


def test_no_output_device_warns_once_and_never_raises(player_factory, caplog):
    out = FakeOutput(error=SoundUnavailable("no sound output device (Error querying device -1)"))
    player = player_factory(out, volume=100)
    with caplog.at_level(logging.WARNING, logger=sounds.__name__):
        for _ in range(3):
            player.play("start")
            assert player.drain()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["sound cues are silent: no sound output device (Error querying device -1)"]

    out.error = None  # a device appears: cues play again, and a later outage warns again
    player.play("stop")
    assert player.drain()
    assert len(out.played) == 1
    out.error = SoundUnavailable("gone")
    with caplog.at_level(logging.WARNING, logger=sounds.__name__):
        player.play("stop")
        assert player.drain()
    assert caplog.records[-1].getMessage() == "sound cues are silent: gone"


def test_an_unexpected_failure_is_logged_and_the_next_cue_still_plays(player_factory, caplog):
    out = FakeOutput(error=RuntimeError("driver exploded"))
    player = player_factory(out, volume=100)
    with caplog.at_level(logging.WARNING, logger=sounds.__name__):
        player.play("start")
        assert player.drain()
    assert caplog.records[-1].getMessage() == "could not play the start sound: driver exploded"
    out.error = None
    player.play("stop")
    assert player.drain()
    assert len(out.played) == 1


def test_unknown_cue_is_logged_not_raised(player_factory, caplog):
    out = FakeOutput()
    player = player_factory(out)
    with caplog.at_level(logging.WARNING, logger=sounds.__name__):
        player.play("fanfare")
    assert "unknown sound cue 'fanfare'" in caplog.text
    assert player.drain() and out.played == []


def test_wavs_are_read_once(player_factory, monkeypatch):
    reads = []
    real = sounds.read_wav
    monkeypatch.setattr(sounds, "read_wav", lambda path: reads.append(path) or real(path))
    out = FakeOutput()
    player = player_factory(out, volume=100)
    for _ in range(3):
        player.play("start")
        assert player.drain()
    assert len(reads) == 1 and len(out.played) == 3


def test_an_idle_worker_ends_and_the_next_cue_starts_a_new_one(player_factory, monkeypatch):
    monkeypatch.setattr(sounds, "IDLE_EXIT_S", 0.02)
    out = FakeOutput()
    player = player_factory(out, volume=100)
    player.play("start")
    assert player.drain()
    wait_until(lambda: not any(t.name == "sound cues" for t in threading.enumerate()), 5, "the idle worker to end")
    player.play("stop")
    assert player.drain()
    assert len(out.played) == 2


# --- the real device ------------------------------------------------------------------------------


def test_cue_arrives_through_the_real_sound_system(virtual_mic):
    """Played with sounddevice into the virtual sink, recorded from its monitor at 16 kHz."""
    import sounddevice as sd

    rate = 16_000
    blocks: list[np.ndarray] = []
    stream = sd.InputStream(
        samplerate=rate, channels=1, dtype="float32", callback=lambda d, f, t, s: blocks.append(d[:, 0].copy())
    )
    player = SoundPlayer(volume=100)
    heard: list[np.ndarray] = []
    try:
        with stream:
            wait_until(lambda: sum(map(len, blocks)) > 0.3 * rate, 10, "the monitor to deliver 0.3 s")
            for volume in (100, 50):
                start = sum(map(len, blocks))
                player.volume = volume
                t0 = time.perf_counter()
                player.play("start")
                assert time.perf_counter() - t0 < 0.05, "play() blocked the caller (opening a device takes longer)"
                wait_until(lambda s=start: _peak(blocks, s) > 0.02, 10, "the cue to reach the sink")
                assert player.drain(5)
                end = sum(map(len, blocks)) + int(0.3 * rate)
                wait_until(lambda e=end: sum(map(len, blocks)) > e, 10, "0.3 s more of the monitor")
                heard.append(np.concatenate(blocks)[start:])
    finally:
        player.close()

    loud, quiet = heard
    active = np.flatnonzero(np.abs(loud) > 0.02)
    segment = loud[active[0] : active[-1] + 1]
    assert 0.1 < len(segment) / rate < 0.3, f"cue lasted {len(segment) / rate:.3f} s"
    half = len(segment) // 2  # rising: E5 first, A5 second, at their pitch (the right rate)
    assert abs(dominant_hz(segment[:half], rate) - 659.3) < 10
    assert abs(dominant_hz(segment[half:], rate) - 880.0) < 10
    ratio_db = 20 * np.log10(np.max(np.abs(quiet)) / np.max(np.abs(loud)))
    assert -13.5 < ratio_db < -10.5, f"volume 50 is {ratio_db:.1f} dB below volume 100, expected -12"


def _peak(blocks: list[np.ndarray], start: int) -> float:
    data = np.concatenate(blocks)[start:] if blocks else np.zeros(0)
    return float(np.max(np.abs(data))) if len(data) else 0.0


# --- playing a saved recording (the history window's Play) -------------------------------------------


def _tone(seconds: float, hz: float, rate: int = 16_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_a_recording_is_played_whole_at_a_rate_the_device_takes(tmp_path):
    from dictation.audio.wav import write_wav

    wav = tmp_path / "take.wav"
    write_wav(wav, _tone(0.5, 440.0), 16_000)
    out = FakeOutput(rate=48_000)
    ended: list[str] = []
    player = sounds.ClipPlayer(out)
    player.play(wav, ended.append)
    wait_until(lambda: ended == [""], 10, "the clip to end")
    ((samples, rate),) = out.played
    assert rate == 48_000 and len(samples) == 3 * 8000
    assert abs(dominant_hz(samples, rate) - 440.0) < 2
    assert not player.playing


def test_stop_ends_a_clip_and_a_new_one_replaces_it(tmp_path):
    from dictation.audio.wav import write_wav

    first, second = tmp_path / "a.wav", tmp_path / "b.wav"
    write_wav(first, _tone(3.0, 440.0), 16_000)
    write_wav(second, _tone(0.2, 880.0), 16_000)
    stops: list[threading.Event] = []

    class StoppableOutput(FakeOutput):
        def play(self, samples, sample_rate, stop=None):  # as a device does: until the end or the stop
            stops.append(stop)
            self.played.append((samples, sample_rate))
            stop.wait(len(samples) / sample_rate)

    out = StoppableOutput(rate=16_000)
    ended: list[str] = []
    player = sounds.ClipPlayer(out)
    player.play(first, ended.append)
    wait_until(lambda: player.playing and stops, 5, "the first clip to start")
    t0 = time.monotonic()
    player.play(second, ended.append)  # the first one is stopped, not waited for
    wait_until(lambda: len(ended) == 2, 5, "both clips to end")
    assert time.monotonic() - t0 < 1.5 and stops[0].is_set()
    assert ended == ["", ""] and [len(s) for s, _ in out.played] == [48_000, 3200]
    player.close()


def test_a_missing_or_damaged_recording_or_no_device_is_said_not_raised(tmp_path):
    from dictation.audio.wav import write_wav

    ended: list[str] = []
    player = sounds.ClipPlayer(FakeOutput())
    player.play(tmp_path / "gone.wav", ended.append)
    wait_until(lambda: len(ended) == 1, 5, "the attempt to end")
    assert ended[0] == f"Cannot play the recording: {tmp_path / 'gone.wav'}: no such file"
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF....WAVEjunk")
    player.play(broken, ended.append)
    wait_until(lambda: len(ended) == 2, 5, "the attempt to end")
    assert ended[1].startswith(f"Cannot play the recording: {broken}")
    wav = tmp_path / "ok.wav"
    write_wav(wav, _tone(0.1, 440.0), 16_000)
    sounds.ClipPlayer(FakeOutput(error=SoundUnavailable("no sound output device"))).play(wav, ended.append)
    wait_until(lambda: len(ended) == 3, 5, "the attempt to end")
    assert ended[2] == "Cannot play the recording: no sound output device"


def test_a_recording_is_heard_through_the_real_sound_system_and_stops(virtual_mic, tmp_path):
    """Played with sounddevice into the virtual sink, recorded from its monitor; stop() silences it."""
    import sounddevice as sd

    from dictation.audio.wav import write_wav

    wav = tmp_path / "take.wav"
    write_wav(wav, _tone(4.0, 523.25), 16_000)
    rate = 16_000
    blocks: list[np.ndarray] = []
    stream = sd.InputStream(
        samplerate=rate, channels=1, dtype="float32", callback=lambda d, f, t, s: blocks.append(d[:, 0].copy())
    )
    player = sounds.ClipPlayer()
    ended: list[str] = []
    with stream:
        wait_until(lambda: sum(map(len, blocks)) > 0.3 * rate, 10, "the monitor to deliver 0.3 s")
        start = sum(map(len, blocks))
        player.play(wav, ended.append)
        wait_until(lambda: _peak(blocks, start) > 0.1, 10, "the recording to reach the sink")
        time.sleep(0.5)
        t0 = time.monotonic()
        player.stop()
        wait_until(lambda: ended == [""], 5, "the clip to end after stop()")
        assert time.monotonic() - t0 < 1.0
        end = sum(map(len, blocks))
        wait_until(lambda: sum(map(len, blocks)) > end + 0.5 * rate, 10, "0.5 s more of the monitor")
    heard = np.concatenate(blocks)[start:]
    active = np.flatnonzero(np.abs(heard) > 0.1)
    assert abs(dominant_hz(heard[active[0] : active[-1] + 1], rate) - 523.25) < 5
    assert len(active) and (active[-1] - active[0]) / rate < 2.5  # stopped well before its 4 s
    tail = heard[end - start + int(0.3 * rate) :]
    assert float(np.max(np.abs(tail))) < 0.02  # silence after the stop
