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
from tests.audio.conftest import wait_until


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

    def play(self, samples: np.ndarray, sample_rate: int, *, on_start=None) -> None:
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
