"""A started AppController with a real engine (tiny checkpoint), real settings, history and worker
threads; only the microphone, key injection, hotkey listener and speaker are fakes (controller_fakes)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import time

import numpy as np
import pytest

from dictation.app.controller import AppController, Services
from dictation.app.workers import AudioWorker, EngineWorker, OutputWorker
from dictation.config import History, Settings
from dictation.config.store import SettingsStore
from dictation.session import Status
from tests.app.controller_fakes import FakeChain, FakeHotkeys, RecorderFactory, SoundLog, hotkey_chooser
from tests.oracle import synth_audio


class Clock:
    """The monotonic clock, plus seconds the test skips (a 'held' key without waiting for it)."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped

    def advance(self, seconds: float) -> None:
        self.skipped += seconds


class Rig:
    """A started controller plus handles on its fakes."""

    def __init__(
        self,
        qtbot,
        tmp_path,
        settings: Settings,
        *,
        engine_factory=None,
        chain: FakeChain | None = None,
        recorders: RecorderFactory | None = None,
    ):
        self.qtbot = qtbot
        self.store = SettingsStore(tmp_path / "config" / "settings.json")
        self.store.save(settings)
        self.history = History(tmp_path / "history.sqlite3")
        self.recorders = recorders or RecorderFactory()
        self.chain = chain or FakeChain()
        self.hotkeys = FakeHotkeys()
        self.sounds = SoundLog()
        self.clock = Clock()
        self.statuses: list[Status] = []
        self.notes: list[tuple[str, str]] = []
        self.engine_worker = EngineWorker(engine_factory)
        services = Services(
            store=self.store,
            history=self.history,
            engine_worker=self.engine_worker,
            audio_worker=AudioWorker(self.recorders, recordings_dir=tmp_path / "recordings"),
            output_worker=OutputWorker(lambda options: self.chain),
            hotkey_chooser=hotkey_chooser(self.hotkeys),
            sound_factory=self.sounds,
            clock=self.clock,
        )
        self.c = AppController(services, settings=settings)
        self.c.status_changed.connect(self.statuses.append)
        self.c.notified.connect(self._note)  # a lambda here would keep the controller alive (tests/app/test_quit.py)

    def _note(self, level: str, message: str) -> None:
        self.notes.append((level, message))

    def start(self) -> None:
        self.c.start()

    def wait_status(self, status: Status, timeout: int = 20_000) -> None:
        self.qtbot.waitUntil(lambda: self.c.status is status, timeout=timeout)

    def dictate(self, samples: np.ndarray) -> None:
        """Press the hotkey, 'speak', release; returns once the mic reported live and the release went in."""
        self.hold(samples)
        self.release(samples)

    def hold(self, samples: np.ndarray) -> None:
        """Press the hotkey with ``samples`` as the take; returns once the mic reported live."""
        self.recorders.next_samples(samples)
        self.hotkeys.press()
        self.wait_status(Status.RECORDING)
        self.qtbot.waitUntil(lambda: self.sounds.played[-1:] == ["start"], timeout=5000)

    def release(self, samples: np.ndarray) -> None:
        self.clock.advance(len(samples) / 16000)  # held for as long as the 'speech' lasts
        self.hotkeys.release()

    def close(self) -> None:
        self.c.shutdown()
        for thread in self.c.left_running:  # the engine was still loading (a busy machine): let it end,
            thread.wait()  # then free the model it loaded; the app's process would simply end here
        self.engine_worker.close()
        self.history.close()


@pytest.fixture
def rig(qtbot, tmp_path, ckpt_untied):
    rigs = []

    def make(settings: Settings | None = None, **kwargs) -> Rig:
        if settings is None:
            settings = Settings()
            settings = settings.replace(engine=settings.engine.replace(model=str(ckpt_untied), device="cpu"))
        r = Rig(qtbot, tmp_path, settings, **kwargs)
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        r.close()


def speech(seconds: float = 2.0, seed: int = 5) -> np.ndarray:
    return synth_audio(seconds, seed=seed)
