"""`Services`: what the controller is built from (tests replace the parts that touch hardware), and
`recorder_config`: what the settings mean for the audio worker's recorder."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dictation.app.history_worker import HistoryWorker
from dictation.app.workers import AudioWorker, DownloadWorker, EngineWorker, OutputWorker, RecorderConfig
from dictation.config import History, Settings
from dictation.config.store import SettingsStore


def recorder_config(settings: Settings) -> RecorderConfig:
    r = settings.recording
    device = None if r.input_device in ("", "default") else r.input_device
    return RecorderConfig(device=device, max_seconds=float(r.max_seconds) + 5.0, keep_open=r.keep_mic_open)


@dataclass
class Services:
    """What the controller is built from; tests replace the parts that touch hardware."""

    store: SettingsStore
    history: History
    engine_worker: EngineWorker = field(default_factory=EngineWorker)
    audio_worker: AudioWorker = field(default_factory=AudioWorker)
    output_worker: OutputWorker = field(default_factory=OutputWorker)
    download_worker: DownloadWorker = field(default_factory=DownloadWorker)
    history_worker: HistoryWorker | None = None  # None: one writing to ``history``'s file
    hotkey_chooser: Callable[[str], Any] | None = None  # preference -> BackendChoice
    sound_factory: Callable[[Settings], Any] | None = None  # settings -> object with play(kind)
    clock: Callable[[], float] = time.monotonic
    personalise: dict[str, Any] = field(default_factory=dict)  # Personaliser's train, samples, options, adapters_dir
