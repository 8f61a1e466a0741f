"""Personalise with the real trainer (`dictation.training`) on the tiny checkpoint, in the running app:
corrected dictations with speech recordings → an adapter the engine loads (five: too few to measure
it, and said so);
a cancelled run leaves nothing behind."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QMessageBox

from dictation.app import personalise as P
from dictation.app.history_window import HistoryWindow
from dictation.asr.tune.train import TrainOptions
from dictation.audio.wav import write_wav
from dictation.config.history import Outcome
from dictation.session import Status
from tests.app.rig import speech


@pytest.fixture(autouse=True)
def say_yes(monkeypatch):
    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.StandardButton.Yes)


def corrected(r, tmp_path, n: int) -> None:
    for i in range(n):
        audio = tmp_path / "recordings" / f"rec-{i}.wav"
        audio.parent.mkdir(exist_ok=True)
        write_wav(audio, speech(1.0, seed=20 + i), 16_000)
        entry_id = r.history.add(f"model text {i}", audio_path=audio, duration_s=1.0, outcome=Outcome.PASTED)
        r.history.correct(entry_id, f"my own words number {i}")
    r.c.history_changed.emit()


def test_personalise_trains_a_real_adapter_that_the_engine_loads(rig, qtbot, tmp_path):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    corrected(r, tmp_path, 5)  # five: one was held out and scored ("WER 960.0%"); now all are trained on
    p = r.c.personaliser
    p.options = TrainOptions(steps=4, rank=2)  # the default NF4 base, a few steps
    window = HistoryWindow(r.c, player=object())
    qtbot.addWidget(window)
    steps = []
    p.progress.connect(lambda step, total, loss, left: steps.append((step, total)))
    window.personalise.button.click()
    qtbot.waitUntil(lambda: not p.running, timeout=120_000)
    assert not p.last_error, p.last_message
    assert steps[-1] == (4, 4)
    out = r.store.load().engine.adapters[-1]
    assert out.enabled and out.path.startswith(str(p.adapters_dir / P.NAME_PREFIX))
    folder = p.adapters_dir / out.path.rsplit("/", 1)[1]
    assert {"adapter_config.json", "adapter_model.safetensors", P.REPORT_FILE} <= {f.name for f in folder.iterdir()}
    report = json.loads((folder / P.REPORT_FILE).read_text())
    assert report["train_clips"] == 5 and report["val_clips"] == 0
    assert report["before"] is None and report["after"] is None
    shown = window.personalise.text()
    assert "No figures: measuring it takes 3 held-out dictations" in shown and "WER" not in shown
    assert [f.name for f in p.adapters_dir.iterdir()] == [folder.name]  # no work folder left
    qtbot.waitUntil(lambda: folder.name in r.c.model_label, timeout=30_000)  # the engine uses it


def test_cancelling_a_real_training_leaves_nothing(rig, qtbot, tmp_path):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    corrected(r, tmp_path, 2)
    p = r.c.personaliser
    p.options = TrainOptions(steps=10_000, rank=2, bits=16)
    p.progress.connect(lambda step, total, loss, left: p.cancel())
    assert p.start() is None
    qtbot.waitUntil(lambda: not p.running, timeout=120_000)
    assert p.last_message == "Personalise was cancelled; no adapter was made."
    assert list(p.adapters_dir.iterdir()) == []
    assert r.store.load().engine.adapters == ()
