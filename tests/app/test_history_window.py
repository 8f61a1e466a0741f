"""The history window over a real History database: what is listed, search, and the entry actions."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMessageBox

from dictation.app.history_window import (
    COL_DURATION,
    COL_LANGUAGE,
    COL_OUTCOME,
    COL_TEXT,
    COL_TIME,
    MESSAGE_MS,
    HistoryWindow,
)
from dictation.audio.sounds import ClipPlayer
from dictation.audio.wav import write_wav
from dictation.config.history import Outcome

LONG_TEXT = "This is a long dictation. " * 40


@pytest.fixture
def entries(controller, tmp_path):
    """Three dictations, oldest first: (id of each)."""
    history = controller.history
    audio = tmp_path / "take-2.wav"
    audio.write_bytes(b"RIFF....WAVE")
    base = datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)
    first = history.add(
        "Der Termin ist am Dienstag.", language="German", duration_s=2.94, outcome=Outcome.TYPED, created=base
    )
    second = history.add(
        "kubectl get pods",
        language="English",
        duration_s=3.0,
        audio_path=audio,
        outcome=Outcome.failed("no paste tool"),
        created=base + timedelta(minutes=5),
    )
    third = history.add(
        LONG_TEXT,
        language="English",
        duration_s=75.0,
        audio_path=tmp_path / "deleted.wav",
        outcome=Outcome.PASTED,
        created=base + timedelta(minutes=9),
    )
    return first, second, third


@pytest.fixture
def window(qtbot, controller, entries):
    window = HistoryWindow(controller)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def cell(window, row, column):
    return window.table.item(row, column)


def test_entries_are_listed_newest_first_in_local_time(window, entries):
    first, second, third = entries
    assert window.row_count() == 3
    assert [window.entry_at(r).id for r in range(3)] == [third, second, first]
    local = datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc).astimezone()
    assert cell(window, 2, COL_TIME).text() == local.strftime("%Y-%m-%d %H:%M")
    assert cell(window, 2, COL_LANGUAGE).text() == "German"
    assert cell(window, 2, COL_DURATION).text() == "2.9 s"
    assert cell(window, 2, COL_OUTCOME).text() == "Typed"
    assert cell(window, 1, COL_OUTCOME).text() == "Failed: no paste tool"
    assert cell(window, 0, COL_DURATION).text() == "1:15 min"
    long_cell = cell(window, 0, COL_TEXT)
    assert len(long_cell.text()) < len(LONG_TEXT) and long_cell.text().endswith("…")
    assert long_cell.toolTip() == LONG_TEXT
    assert window.count_label.text() == "3 dictations"


def test_the_text_tooltip_says_what_was_heard_where_the_typed_text_differs(window, controller, entries):
    first, second, _ = entries
    history = controller.history
    history.update(first, raw_text="Der Termin ist am Dienstag Punkt")  # spoken punctuation made the mark
    history.update(second, raw_text="kubectl get pods")  # typed as heard
    window.reload()
    rows = {window.entry_at(r).id: r for r in range(window.row_count())}
    assert cell(window, rows[first], COL_TEXT).toolTip() == (
        "Der Termin ist am Dienstag.\n\nAs heard: Der Termin ist am Dienstag Punkt"
    )
    assert cell(window, rows[second], COL_TEXT).toolTip() == "kubectl get pods"


def test_today_and_yesterday_are_named():
    from dictation.app.history_window import local_time

    now = datetime(2024, 5, 2, 15, 0).astimezone()
    assert local_time(now - timedelta(hours=2), now) == (now - timedelta(hours=2)).strftime("Today %H:%M")
    assert local_time(now - timedelta(days=1), now).startswith("Yesterday ")


def test_search_shows_only_matching_entries(qtbot, window, entries):
    qtbot.keyClicks(window.search, "KUBECTL")
    qtbot.waitUntil(lambda: window.row_count() == 1)
    assert window.entry_at(0).id == entries[1]
    assert window.count_label.text() == "1 matching"
    window.search.clear()
    qtbot.waitUntil(lambda: window.row_count() == 3)


def test_buttons_need_a_selection(window):
    for button in (window.copy_button, window.retype_button, window.delete_button, window.retranscribe_button):
        assert not button.isEnabled()


def test_copy_button_and_double_click_copy_the_selected_entry(qtbot, window, controller, entries):
    window.select_entry(entries[0])
    qtbot.mouseClick(window.copy_button, Qt.MouseButton.LeftButton)
    rect = window.table.visualItemRect(cell(window, 1, COL_TEXT))
    qtbot.mouseClick(window.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.mouseDClick(window.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert controller.called("copy_entry") == [("copy_entry", entries[0]), ("copy_entry", entries[1])]


def test_retype_hides_the_window_first(qtbot, window, controller, entries):
    window.select_entry(entries[1])
    hidden_when_called = []
    controller.retype_entry = lambda entry_id: hidden_when_called.append((entry_id, window.isHidden()))
    qtbot.mouseClick(window.retype_button, Qt.MouseButton.LeftButton)
    assert hidden_when_called == [(entries[1], True)]


def test_retranscribe_is_offered_only_while_the_recording_exists(qtbot, window, controller, entries):
    first, second, third = entries
    window.select_entry(first)  # no recording kept
    assert not window.retranscribe_button.isEnabled()
    window.select_entry(third)  # recording deleted since
    assert not window.retranscribe_button.isEnabled()
    assert "no longer kept" in window.retranscribe_button.toolTip()
    window.select_entry(second)
    assert window.retranscribe_button.isEnabled()
    qtbot.mouseClick(window.retranscribe_button, Qt.MouseButton.LeftButton)
    assert controller.called("retranscribe_entry") == [("retranscribe_entry", second)]


@pytest.mark.parametrize("answer", [QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No])
def test_delete_asks_first(qtbot, window, controller, entries, monkeypatch, answer):
    asked = []

    def question(parent, title, text, *args):
        asked.append(text)
        return answer

    monkeypatch.setattr(QMessageBox, "question", question)
    window.select_entry(entries[1])
    qtbot.mouseClick(window.delete_button, Qt.MouseButton.LeftButton)
    assert len(asked) == 1 and "kubectl get pods" in asked[0]
    if answer == QMessageBox.StandardButton.Yes:
        assert controller.history.get(entries[1]) is None
        assert [window.entry_at(r).id for r in range(window.row_count())] == [entries[2], entries[0]]
    else:
        assert controller.called("delete_entry") == []
        assert window.row_count() == 3


def test_new_and_changed_entries_appear_and_the_selection_stays(window, controller, entries):
    window.select_entry(entries[0])
    new = controller.history.add("A new dictation", language="English", outcome=Outcome.PENDING)
    controller.history.set_outcome(entries[0], Outcome.PASTED)
    controller.history_changed.emit()
    assert window.row_count() == 4
    assert cell(window, 0, COL_TEXT).text() == "A new dictation"
    assert window.entry_at(0).id == new
    assert window.selected_id() == entries[0]
    assert cell(window, 3, COL_OUTCOME).text() == "Pasted"


# --- closing, confirmations, progress, playback -------------------------------------------------------


def test_the_close_button_and_esc_close_the_window(qtbot, window):
    qtbot.mouseClick(window.close_button, Qt.MouseButton.LeftButton)
    assert not window.isVisible()
    with qtbot.waitActive(window):  # Esc is the window's shortcut: it acts in the active window
        window.bring_forward()
    window.search.setFocus()
    qtbot.keyClick(window.search, Qt.Key.Key_Escape)
    assert not window.isVisible()


def test_a_copy_is_confirmed_under_the_table(qtbot, window, entries):
    QGuiApplication.clipboard().clear()
    window.select_entry(entries[0])
    qtbot.mouseClick(window.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "Der Termin ist am Dienstag."
    assert window.message_text() == "Copied to the clipboard."
    qtbot.waitUntil(lambda: window.message_text() == "", timeout=MESSAGE_MS + 2000)  # it fades


def test_retranscribing_shows_progress_until_the_result_arrives(qtbot, window, controller, entries):
    second = entries[1]
    window.select_entry(second)
    qtbot.mouseClick(window.retranscribe_button, Qt.MouseButton.LeftButton)
    assert controller.called("retranscribe_entry") == [("retranscribe_entry", second)]
    assert window.busy.isVisible() and window.busy.maximum() == 0  # a moving bar
    assert window.message_text().startswith("Transcribing the recording from ") and "again" in window.message_text()
    assert not window.retranscribe_button.isEnabled()  # not twice at once
    controller.history.update_text(second, "kubectl get pods -A", language="English")
    controller.retranscribed.emit(second, "")
    assert not window.busy.isVisible()
    assert window.message_text() == "Transcribed again; the text is updated."
    assert window.selected_id() == second and window.selected_entry().text == "kubectl get pods -A"
    assert window.retranscribe_button.isEnabled()

    qtbot.mouseClick(window.retranscribe_button, Qt.MouseButton.LeftButton)
    controller.retranscribed.emit(second, "The speech model is not loaded; try again once it is ready.")
    assert not window.busy.isVisible()
    assert window.message_text() == "The speech model is not loaded; try again once it is ready."
    assert "c62828" in window.message.styleSheet()  # an error, shown in red until the next action


def test_the_language_column_is_filled(qtbot, controller):
    history = controller.history
    mixed = history.add("Das Meeting ist at three", language="German,English", duration_s=2.0)
    unnamed = history.add("hello", language=None, duration_s=1.0)
    untranscribed = history.add("", duration_s=1.0, outcome=Outcome.failed("not transcribed: no model"))
    window = HistoryWindow(controller)
    qtbot.addWidget(window)
    languages = {window.entry_at(r).id: cell(window, r, COL_LANGUAGE) for r in range(window.row_count())}
    assert languages[mixed].text() == "German, English"
    assert languages[unnamed].text() == "—"
    assert "did not name the language" in languages[unnamed].toolTip()
    assert languages[untranscribed].text() == ""


class RecordingOutput:
    """A sound output that keeps what it was given; ``hold`` makes it play until stopped."""

    def __init__(self, hold: bool = False):
        self.hold = hold
        self.played: list[tuple[np.ndarray, int]] = []
        self.started = threading.Event()

    def output_rate(self, preferred: int) -> int:
        return 48_000

    def play(self, samples, sample_rate, stop=None):
        self.played.append((samples, sample_rate))
        self.started.set()
        if self.hold:
            assert stop.wait(10), "never stopped"


@pytest.fixture
def take(entries, tmp_path):
    """The second entry's recording as a real WAV: 0.5 s of a 440 Hz tone at 16 kHz."""
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)).astype(np.float32)
    write_wav(tmp_path / "take-2.wav", tone, 16000)
    return tone


def test_play_sounds_the_saved_recording(qtbot, controller, entries, take):
    out = RecordingOutput()
    window = HistoryWindow(controller, player=ClipPlayer(out))
    qtbot.addWidget(window)
    window.select_entry(entries[0])  # no recording kept
    assert not window.play_button.isEnabled()
    window.select_entry(entries[1])
    assert window.play_button.isEnabled() and window.play_button.text() == "Play"
    qtbot.mouseClick(window.play_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.play_button.text() == "Play" and bool(out.played), timeout=5000)
    ((samples, rate),) = out.played
    assert rate == 48_000 and len(samples) == 3 * len(take)  # the whole take, at the device's rate
    np.testing.assert_allclose(samples[::3][100:-100], take[100:-100], atol=0.02)
    assert window.message_text() == ""


def test_stop_ends_the_playback_and_closing_the_window_does_too(qtbot, controller, entries, take):
    out = RecordingOutput(hold=True)
    player = ClipPlayer(out)
    window = HistoryWindow(controller, player=player)
    qtbot.addWidget(window)
    window.show()
    window.select_entry(entries[1])
    qtbot.mouseClick(window.play_button, Qt.MouseButton.LeftButton)
    assert out.started.wait(5)
    assert window.play_button.text() == "Stop" and window.message_text().startswith("Playing the recording from")
    qtbot.mouseClick(window.play_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.play_button.text() == "Play", timeout=5000)
    out.started.clear()
    qtbot.mouseClick(window.play_button, Qt.MouseButton.LeftButton)
    assert out.started.wait(5)
    window.close()
    qtbot.waitUntil(lambda: not player.playing and window.play_button.text() == "Play", timeout=5000)


def test_a_recording_that_cannot_be_played_is_explained(qtbot, controller, entries):
    window = HistoryWindow(controller, player=ClipPlayer(RecordingOutput()))  # take-2.wav is not a real WAV
    qtbot.addWidget(window)
    window.select_entry(entries[1])
    qtbot.mouseClick(window.play_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.play_button.text() == "Play" and window.message_text() != "", timeout=5000)
    assert window.message_text().startswith("Cannot play the recording: ") and "take-2.wav" in window.message_text()


def test_a_recovered_dictation_is_labelled_so():
    from dictation.app.history_window import outcome_label

    assert outcome_label(Outcome.RECOVERED) == "Recovered"
    assert outcome_label(Outcome.PENDING) == "Pending"
