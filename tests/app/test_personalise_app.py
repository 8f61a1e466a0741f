"""Correcting and Personalise on the real controller (tiny engine, worker threads, real history worker):
a dictation is corrected in the History window, Personalise switches the new adapter on in the loaded
engine, and quitting mid-training cancels it."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QMessageBox

from dictation.app.history_window import COL_OUTCOME, HistoryWindow
from dictation.config.history import History, Outcome
from dictation.session import Status
from tests.app.rig import speech
from tests.app.test_personalise import FakeTrainer, edit_with


@pytest.fixture(autouse=True)
def say_yes(monkeypatch):
    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.StandardButton.Yes)


def dictate_and_correct(r, qtbot, text: str) -> tuple[HistoryWindow, int]:
    r.dictate(speech(seed=9))
    qtbot.waitUntil(lambda: r.history.count() == 1, timeout=20_000)
    entry = r.history.recent(1)[0]
    qtbot.waitUntil(lambda: r.history.get(entry.id).outcome == Outcome.PASTED, timeout=20_000)
    window = HistoryWindow(r.c, player=object())
    qtbot.addWidget(window)
    window.show()
    window.select_entry(entry.id)
    edit_with(qtbot, window, text)
    qtbot.waitUntil(lambda: r.history.get(entry.id).corrected, timeout=10_000)
    qtbot.waitUntil(lambda: window.message_text().startswith("Correction saved"), timeout=5000)
    return window, entry.id


def test_a_corrected_dictation_trains_an_adapter_the_engine_then_uses(rig, qtbot, make_adapter):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    window, entry_id = dictate_and_correct(r, qtbot, "kubectl get pods")
    entry = r.history.get(entry_id)
    assert entry.text == "kubectl get pods" and entry.audio_path is not None and entry.audio_path.is_file()
    assert window.table.item(0, COL_OUTCOME).text() == "Pasted · corrected"

    trainer = FakeTrainer(make_adapter("trained"))
    r.c.personaliser.train = trainer
    r.c.personaliser.samples = lambda path: [e.text for e in History(path).corrected_entries()]
    panel = window.personalise
    assert panel.button.isEnabled()
    panel.button.click()
    qtbot.waitUntil(lambda: not r.c.personaliser.running, timeout=20_000)
    assert not r.c.personaliser.last_error, panel.text()
    assert trainer.calls[0]["samples"] == ["kubectl get pods"]  # read from the app's own history file
    out = trainer.calls[0]["out"]
    assert r.store.load().engine.adapters[-1].path == str(out) and r.store.load().engine.adapters[-1].enabled
    qtbot.waitUntil(lambda: out.name in r.c.model_label, timeout=20_000)  # swapped into the loaded model
    r.wait_status(Status.IDLE)
    r.dictate(speech(seed=3))
    qtbot.waitUntil(lambda: r.history.count() == 2 and r.history.recent(1)[0].outcome == Outcome.PASTED, timeout=20_000)


def test_quitting_while_training_cancels_it(rig, qtbot):
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    dictate_and_correct(r, qtbot, "kubectl get pods")
    trainer = FakeTrainer(mode="wait")
    r.c.personaliser.train = trainer
    r.c.personaliser.samples = lambda path: ["one"]
    assert r.c.personaliser.start() is None
    qtbot.waitUntil(lambda: bool(trainer.calls) and trainer.calls[0]["out"].exists(), timeout=10_000)
    r.c.shutdown()  # the app quits
    assert trainer.saw_stop.is_set() and not r.c.personaliser.running
    assert not trainer.calls[0]["out"].exists()
    assert r.store.load().engine.adapters == ()
