"""The history window over a real History database: what is listed, search, and the entry actions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from dictation.app.history_window import COL_DURATION, COL_LANGUAGE, COL_OUTCOME, COL_TEXT, COL_TIME, HistoryWindow
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


def test_a_recovered_dictation_is_labelled_so():
    from dictation.app.history_window import outcome_label

    assert outcome_label(Outcome.RECOVERED) == "Recovered"
    assert outcome_label(Outcome.PENDING) == "Pending"
