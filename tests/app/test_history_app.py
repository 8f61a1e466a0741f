"""The history window on the real controller (tiny engine, worker threads): a dictation's language cell,
re-transcribing with progress, and log lines that end in a word, not "()"."""

from __future__ import annotations

import logging

from PySide6.QtCore import Qt

from dictation.app.history_window import COL_LANGUAGE, NO_LANGUAGE, HistoryWindow
from dictation.config.history import Outcome
from dictation.session import Status
from tests.app.rig import speech


def test_a_dictation_in_the_window_and_transcribed_again(rig, qtbot, caplog):
    caplog.set_level(logging.INFO)
    r = rig()
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech(seed=9))
    qtbot.waitUntil(lambda: r.history.count() == 1, timeout=20_000)
    entry = r.history.recent(1)[0]
    qtbot.waitUntil(lambda: r.history.get(entry.id).outcome == Outcome.PASTED, timeout=20_000)

    window = HistoryWindow(r.c)
    qtbot.addWidget(window)
    window.show()
    # The tiny random model names no language: the cell says so instead of staying blank.
    assert window.table.item(0, COL_LANGUAGE).text() == (entry.language or NO_LANGUAGE)
    window.select_entry(entry.id)
    done = []
    r.c.retranscribed.connect(lambda entry_id, error: done.append((entry_id, error)))
    qtbot.mouseClick(window.retranscribe_button, Qt.MouseButton.LeftButton)
    assert window.busy.isVisible()
    qtbot.waitUntil(lambda: done == [(entry.id, "")], timeout=20_000)
    assert not window.busy.isVisible()
    assert window.message_text() == "Transcribed again; the text is updated."

    r.c.apply_settings(r.c.settings.replace(engine=r.c.settings.engine.replace(model="")))  # no model now
    qtbot.waitUntil(lambda: r.c.session.model_state.value == "not_chosen", timeout=20_000)
    qtbot.mouseClick(window.retranscribe_button, Qt.MouseButton.LeftButton)
    assert done[-1] == (entry.id, "The speech model is not loaded; try again once it is ready.")
    assert not window.busy.isVisible() and window.message_text() == done[-1][1]

    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("transcribed take 1: ") and ", language " in m for m in messages)
    assert not [m for m in messages if m.rstrip().endswith("()")]
