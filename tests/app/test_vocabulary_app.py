"""Words learned from corrections, through the real windows: Edit in the history, the offer under the table,
the words in Settings > Vocabulary with where they came from, and Remove. Settings and history are real
files (FakeController)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from PySide6.QtCore import Qt

from dictation.app.history_window import HistoryWindow
from dictation.app.settings_window import SettingsWindow
from dictation.app.widgets.vocabulary_offer import VocabularyOffer
from dictation.app.widgets.vocabulary_table import TYPED_SOURCE
from dictation.config.history import Outcome
from dictation.vocabulary import NewWord, model_context
from tests.app.test_personalise import edit_with

HEARD = "I talked to doctor when about the cube and eighties cluster."
CORRECTED = "I talked to Dr. Nguyen about the Kubernetes cluster."
DICTATED = datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)


def set_mode(controller, mode: str, context: str = "") -> None:
    s = controller.settings
    transcription = s.transcription.replace(learn_from_corrections=mode, context=context)
    assert controller.apply_settings(s.replace(transcription=transcription)) == []


@pytest.fixture
def history(qtbot, controller):
    """The history window with one typed dictation selected; (window, entry id)."""
    entry_id = controller.history.add(HEARD, language="English", outcome=Outcome.TYPED, created=DICTATED)
    window = HistoryWindow(controller, player=object())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    window.select_entry(entry_id)
    return window, entry_id


@pytest.fixture
def settings_window(qtbot, controller):
    def open_() -> SettingsWindow:
        window = SettingsWindow(controller)
        qtbot.addWidget(window)
        window.bring_forward("vocabulary")
        qtbot.waitExposed(window)
        return window

    return open_


def click(qtbot, widget) -> None:
    qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)


def test_a_correction_offers_its_new_words_and_accepted_they_are_listed_and_removable(
    qtbot, history, controller, settings_window
):
    window, entry_id = history
    set_mode(controller, "propose", context="PySide6, Helm")
    assert edit_with(qtbot, window, CORRECTED) == HEARD
    offer = window.vocabulary_offer
    qtbot.waitUntil(offer.isVisible, timeout=5000)
    assert offer.offered() == ["Dr. Nguyen", "Kubernetes"]
    assert controller.saved_settings().transcription.learned_words == ()  # offered, not added yet

    click(qtbot, offer.add_button)
    assert not offer.isVisible()
    assert "Added to the vocabulary: Dr. Nguyen, Kubernetes" in window.message_text()
    saved = controller.saved_settings().transcription
    assert [(w.word, w.heard, w.entry_id) for w in saved.learned_words] == [
        ("Dr. Nguyen", "doctor when", entry_id),
        ("Kubernetes", "cube and eighties", entry_id),
    ]
    assert model_context(saved) == "PySide6, Helm\nDr. Nguyen, Kubernetes"  # what the engine is given

    settings = settings_window()
    page = settings.page("vocabulary")
    when = DICTATED.astimezone().strftime("%Y-%m-%d %H:%M")
    assert page.table.words() == [
        ("PySide6", TYPED_SOURCE),
        ("Helm", TYPED_SOURCE),
        ("Dr. Nguyen", f"Your correction of the dictation from {when} (heard as “doctor when”)"),
        ("Kubernetes", f"Your correction of the dictation from {when} (heard as “cube and eighties”)"),
    ]

    click(qtbot, page.table.remove_button("Kubernetes"))
    assert [w.word for w in controller.saved_settings().transcription.learned_words] == ["Dr. Nguyen"]
    click(qtbot, page.table.remove_button("PySide6"))
    assert controller.saved_settings().transcription.context == "Helm"
    assert [word for word, _ in page.table.words()] == ["Helm", "Dr. Nguyen"]
    assert model_context(controller.saved_settings().transcription) == "Helm\nDr. Nguyen"


def test_unchecked_words_are_not_added_and_not_now_adds_nothing(qtbot, history, controller):
    window, _ = history
    edit_with(qtbot, window, CORRECTED)  # "propose" is the default
    offer = window.vocabulary_offer
    qtbot.waitUntil(offer.isVisible, timeout=5000)
    offer.checks[0].setChecked(False)
    click(qtbot, offer.add_button)
    assert [w.word for w in controller.saved_settings().transcription.learned_words] == ["Kubernetes"]

    window.select_entry(history[1])
    edit_with(qtbot, window, CORRECTED + " Ask gRPC.")
    qtbot.waitUntil(offer.isVisible, timeout=5000)
    assert offer.offered() == ["gRPC"]  # compared with the text before this edit, which had the others
    click(qtbot, offer.dismiss_button)
    assert not offer.isVisible()
    assert [w.word for w in controller.saved_settings().transcription.learned_words] == ["Kubernetes"]


def test_an_ampersand_in_a_word_is_shown_not_taken_as_a_shortcut(qtbot):
    offer = VocabularyOffer()
    qtbot.addWidget(offer)
    offer.offer(1, DICTATED, [NewWord("AT&T", "A T and T")])
    assert offer.offered() == ["AT&T"]
    assert offer.checks[0].text() == "AT&&T"  # Qt shows "&&" as one "&"
    with qtbot.waitSignal(offer.accepted) as accepted:
        click(qtbot, offer.add_button)
    assert accepted.args == [1, DICTATED, [NewWord("AT&T", "A T and T")]]


def test_add_mode_adds_the_words_at_once_and_says_so(qtbot, history, controller):
    window, entry_id = history
    set_mode(controller, "add")
    edit_with(qtbot, window, CORRECTED)
    qtbot.waitUntil(lambda: "Added to the vocabulary" in window.message_text(), timeout=5000)
    assert not window.vocabulary_offer.isVisible()
    assert [(w.word, w.entry_id) for w in controller.saved_settings().transcription.learned_words] == [
        ("Dr. Nguyen", entry_id),
        ("Kubernetes", entry_id),
    ]


def test_off_mode_and_a_failed_save_learn_nothing(qtbot, history, controller):
    window, _ = history
    set_mode(controller, "off")
    edit_with(qtbot, window, CORRECTED)
    qtbot.waitUntil(lambda: window.message_text().startswith("Correction saved"), timeout=5000)
    qtbot.wait(50)
    assert not window.vocabulary_offer.isVisible()

    set_mode(controller, "add")
    controller.correct_fails = "the disk is full"
    edit_with(qtbot, window, CORRECTED + " Ask gRPC.")
    qtbot.waitUntil(lambda: "not saved" in window.message_text(), timeout=5000)
    assert controller.saved_settings().transcription.learned_words == ()


def test_the_page_shows_learned_words_added_while_it_is_open(qtbot, history, controller, settings_window):
    window, _ = history
    settings = settings_window()
    page = settings.page("vocabulary")
    assert page.table.words() == []
    assert "no context" in page.summary.text()
    set_mode(controller, "add")
    edit_with(qtbot, window, CORRECTED)
    qtbot.waitUntil(lambda: len(page.table.words()) == 2, timeout=5000)
    assert "2 terms" in page.summary.text()
