"""The history window: past dictations (newest first) with search, Play, Copy, Edit, Re-type, Delete and
Re-transcribe, Personalise, and a Close button (or Esc).

The text of every dictation is in the history before it is typed, so this is where a dictation that
went to the wrong window, or failed to arrive, is found again. Double-click copies an entry. A line
under the table confirms a copy, says what plays, and shows a busy bar while a recording is being
transcribed again (the engine reports no percentage); failures stay there until the next action.
Play sounds the saved recording through the default output (``dictation.audio.sounds.ClipPlayer``).

Edit (or F2) opens the entry's text in a dialog (Ctrl+Enter or OK saves, Esc cancels); the text is
saved through the history worker (`AppController.correct_entry`, `History.correct`), which marks the
entry corrected: the Outcome column says so, and the entry and its recording are kept from pruning
as training material for Personalise (`dictation.app.personalise`). A correction that cannot be
saved is said on the line under the table, and the next Edit of that entry starts from the text the
user wrote. Re-transcribing a corrected entry replaces the user's text, so it asks first.

A saved correction's new names and terms (`dictation.vocabulary.new_words`, against the text as it was
before the edit) are offered for the vocabulary under the table (`VocabularyOffer`), or added at once,
as the setting ``transcription.learn_from_corrections`` says; Settings > Vocabulary lists and removes them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from dictation.app.widgets.fields import ERROR_STYLE, WrappedLabel, style_as_help
from dictation.app.widgets.personalise_panel import PersonalisePanel
from dictation.app.widgets.vocabulary_offer import VocabularyOffer
from dictation.config.history import HistoryEntry, Outcome
from dictation.vocabulary import NewWord, learn, new_words, vocabulary_terms

MAX_ROWS = 500
SEARCH_DELAY_MS = 200
COLUMNS = ("Time", "Language", "Duration", "Text", "Outcome")
COL_TIME, COL_LANGUAGE, COL_DURATION, COL_TEXT, COL_OUTCOME = range(len(COLUMNS))
ENTRY_ID = Qt.ItemDataRole.UserRole + 1
TEXT_PREVIEW = 200  # characters in the table; the tooltip has all of it
MESSAGE_MS = 4000  # how long a confirmation stays under the table
NO_LANGUAGE = "—"  # a transcript whose language the model did not name
CORRECTED_LABEL = "corrected"  # added to the Outcome column of an entry whose text the user corrected
CORRECTED_TIP = (
    "You corrected this text. The dictation and its recording are kept (not pruned) as material "
    "for Personalise, until you delete it."
)

_OUTCOME_LABELS = {
    Outcome.PENDING: "Pending",
    Outcome.TYPED: "Typed",
    Outcome.PASTED: "Pasted",
    Outcome.CLIPBOARD_ONLY: "On clipboard",
    Outcome.RECOVERED: "Recovered",  # interrupted by a crash, transcribed at the next start, not typed
}


def local_time(created: datetime, now: datetime | None = None) -> str:
    """The entry's time in the local time zone: "Today 14:03", "Yesterday 09:12", "2024-05-01 14:03"."""
    local = created.astimezone()
    today = (now or datetime.now().astimezone()).astimezone().date()
    if local.date() == today:
        return local.strftime("Today %H:%M")
    if (today - local.date()).days == 1:
        return local.strftime("Yesterday %H:%M")
    return local.strftime("%Y-%m-%d %H:%M")


def outcome_label(outcome: str) -> str:
    if outcome.startswith(Outcome.FAILED_PREFIX):
        return "Failed: " + outcome[len(Outcome.FAILED_PREFIX) :]
    if outcome.startswith(Outcome.KEPT_PREFIX):  # "On clipboard, not delivered: no window had ..."
        return "On clipboard, " + outcome[len(Outcome.KEPT_PREFIX) :]
    return _OUTCOME_LABELS.get(outcome, outcome)


def entry_outcome_label(entry: HistoryEntry) -> str:
    """The Outcome column: what happened to the text, and "corrected" when the user edited it."""
    label = outcome_label(entry.outcome)
    return f"{label} · {CORRECTED_LABEL}" if entry.corrected else label


class EditDialog(QDialog):
    """The text of one dictation to correct: Ctrl+Enter (or OK) saves, Esc (or Cancel) leaves it."""

    def __init__(self, text: str, when: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Correct the dictation")
        self.resize(560, 260)
        note = WrappedLabel(
            f"The dictation from {when}. Write what you said, exactly: a corrected dictation and its "
            "recording are kept, and Personalise trains a personal adapter on them. Ctrl+Enter saves."
        )
        style_as_help(note)
        self.editor = QPlainTextEdit()
        self.editor.setPlainText(text)
        self.editor.moveCursor(QTextCursor.MoveOperation.End)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Save")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.editor.textChanged.connect(self._update)
        self.editor.installEventFilter(self)  # Ctrl+Enter saves (Enter alone is a new line)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addWidget(self.editor, 1)
        layout.addWidget(self.buttons)
        self._update()

    def text(self) -> str:
        return self.editor.toPlainText()

    def eventFilter(self, watched: Any, event: Any) -> bool:
        if (
            watched is self.editor
            and event.type() == QEvent.Type.KeyPress
            and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            and event.modifiers() & Qt.KeyboardModifier.ControlModifier
        ):
            self.accept()
            return True
        return super().eventFilter(watched, event)

    def accept(self) -> None:
        if self.text().strip():  # an empty correction is no text: Delete removes an entry
            super().accept()

    def _update(self) -> None:
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setEnabled(bool(self.text().strip()))
        ok.setToolTip("" if ok.isEnabled() else "A corrected dictation needs some text; Delete removes an entry.")


def text_tip(entry: HistoryEntry) -> str:
    """The Text column's tooltip: all of the text, and what the model heard where voice commands,
    spoken punctuation or text options made the typed text differ from it."""
    raw = entry.raw_text
    if raw is None or raw.strip() == entry.text.strip():
        return entry.text
    return f"{entry.text}\n\nAs heard: {raw}"


def language_label(entry: HistoryEntry) -> str:
    """ "English", "German, English" for a long dictation in two languages, a dash when not named."""
    if entry.language:
        return ", ".join(part.strip() for part in entry.language.split(",") if part.strip())
    return NO_LANGUAGE if entry.text.strip() else ""


def duration_label(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)}:{int(seconds % 60):02d} min"


class HistoryWindow(QWidget):
    _playback_ended = Signal(str)  # from the player's thread: "" or why it could not play

    def __init__(self, controller: Any, parent: QWidget | None = None, *, player: Any = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.controller = controller
        self.setWindowTitle("Dictation history")
        self.resize(900, 560)
        self._entries: dict[int, HistoryEntry] = {}
        self._retranscribing: set[int] = set()
        self._playing: int | None = None  # the entry whose recording plays
        self._drafts: dict[int, str] = {}  # entry id -> the user's text while (or after failing) being saved
        self._before: dict[int, HistoryEntry] = {}  # entry id -> the entry as it was before the correction
        if player is None:
            from dictation.audio.sounds import ClipPlayer

            player = ClipPlayer()
        self.player = player
        self._playback_ended.connect(self._on_playback_ended)

        self.search = QLineEdit()
        self.search.setPlaceholderText("Search the history…")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.reload)
        self.search.textChanged.connect(self._search_timer.start)
        self.search.returnPressed.connect(self.reload)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        header = self.table.horizontalHeader()
        for column in (COL_TIME, COL_LANGUAGE, COL_DURATION, COL_OUTCOME):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COL_TEXT, QHeaderView.ResizeMode.Stretch)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.cellDoubleClicked.connect(lambda row, _column: self.copy_entry(self.entry_at(row).id))

        self.count_label = QLabel()
        self.play_button = QPushButton("Play")
        self.play_button.clicked.connect(self.toggle_playback)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the text to the clipboard (or double-click the entry).")
        self.copy_button.clicked.connect(self.copy_selected)
        self.edit_button = QPushButton("Edit…")
        self.edit_button.setToolTip("Correct the text (F2). Personalise learns from corrected dictations.")
        self.edit_button.clicked.connect(self.edit_selected)
        self.retype_button = QPushButton("Re-type")
        self.retype_button.setToolTip("Hide this window and type the text into the window that then has the focus.")
        self.retype_button.clicked.connect(self.retype_selected)
        self.retranscribe_button = QPushButton("Re-transcribe")
        self.retranscribe_button.setToolTip(
            "Run the saved recording through the current model, adapters and vocabulary again."
        )
        self.retranscribe_button.clicked.connect(self.retranscribe_selected)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_selected)
        self.close_button = QPushButton("Close")
        self.close_button.setToolTip("Close this window (Esc).")
        self.close_button.clicked.connect(self.close)

        self.busy = QProgressBar()
        self.busy.setRange(0, 0)  # moving without a percentage: the engine reports none
        self.busy.setMaximumWidth(120)
        self.busy.setTextVisible(False)
        self.busy.hide()
        self.message = QLabel()
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._message_timer = QTimer(self)
        self._message_timer.setSingleShot(True)
        self._message_timer.setInterval(MESSAGE_MS)
        self._message_timer.timeout.connect(self.message.clear)
        status = QHBoxLayout()
        status.addWidget(self.busy)
        status.addWidget(self.message, 1)

        buttons = QHBoxLayout()
        buttons.addWidget(self.count_label, 1)
        for button in (
            self.play_button,
            self.copy_button,
            self.edit_button,
            self.retype_button,
            self.retranscribe_button,
            self.delete_button,
        ):
            buttons.addWidget(button)
        buttons.addSpacing(16)
        buttons.addWidget(self.close_button)
        self.personalise = PersonalisePanel(controller.personaliser)
        self.vocabulary_offer = VocabularyOffer()
        self.vocabulary_offer.accepted.connect(self.add_to_vocabulary)
        layout = QVBoxLayout(self)
        layout.addWidget(self.search)
        layout.addWidget(self.table, 1)
        layout.addLayout(status)
        layout.addWidget(self.vocabulary_offer)
        layout.addLayout(buttons)
        layout.addWidget(self.personalise)

        QShortcut(QKeySequence(QKeySequence.StandardKey.Copy), self.table, self.copy_selected)
        QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.table, self.delete_selected)
        QShortcut(QKeySequence(QKeySequence.StandardKey.Find), self, self.search.setFocus)
        QShortcut(QKeySequence(Qt.Key.Key_F2), self.table, self.edit_selected)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.close)
        controller.history_changed.connect(self.reload)
        retranscribed = getattr(controller, "retranscribed", None)
        if retranscribed is not None:
            retranscribed.connect(self._on_retranscribed)
        controller.corrected.connect(self._on_corrected)
        self.reload()

    # --- contents ---------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the entries again (all recent ones, or those matching the search), keeping the selection."""
        self._search_timer.stop()
        selected = self.selected_id()
        query = self.search.text().strip()
        history = self.controller.history
        entries = history.search(query, MAX_ROWS) if query else history.recent(MAX_ROWS)
        self._entries = {e.id: e for e in entries}
        self.table.setUpdatesEnabled(False)
        self.table.clearSelection()
        self.table.setRowCount(len(entries))
        for row, entry in enumerate(entries):
            self._fill_row(row, entry)
        self.table.setUpdatesEnabled(True)
        if selected is not None and selected in self._entries:
            self.select_entry(selected)
        if query:
            self.count_label.setText(
                f"{len(entries)} matching" + (" (newest shown)" if len(entries) >= MAX_ROWS else "")
            )
        else:
            self.count_label.setText(
                f"{len(entries)} dictations" + (" (newest shown)" if len(entries) >= MAX_ROWS else "")
            )
        self._update_buttons()

    def _fill_row(self, row: int, entry: HistoryEntry) -> None:
        text = " ".join(entry.text.split())
        preview = text if len(text) <= TEXT_PREVIEW else text[: TEXT_PREVIEW - 1] + "…"
        cells = (
            local_time(entry.created),
            language_label(entry),
            duration_label(entry.duration_s),
            preview,
            entry_outcome_label(entry),
        )
        for column, value in enumerate(cells):
            item = QTableWidgetItem(value)
            item.setData(ENTRY_ID, entry.id)
            if column == COL_TEXT:
                item.setToolTip(text_tip(entry))
            elif column == COL_TIME:
                item.setToolTip(entry.created.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z"))
            elif column == COL_OUTCOME and (entry.model_label or entry.corrected):
                tips = [f"Model: {entry.model_label}"] if entry.model_label else []
                item.setToolTip("\n".join(tips + ([CORRECTED_TIP] if entry.corrected else [])))
            elif column == COL_LANGUAGE and cells[column] == NO_LANGUAGE:
                item.setToolTip("The model did not name the language of this dictation.")
            if column == COL_DURATION:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, column, item)

    def row_count(self) -> int:
        return self.table.rowCount()

    def entry_at(self, row: int) -> HistoryEntry:
        return self._entries[self.table.item(row, COL_TIME).data(ENTRY_ID)]

    # --- selection --------------------------------------------------------------------------------

    def selected_id(self) -> int | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.table.item(rows[0].row(), COL_TIME).data(ENTRY_ID)

    def selected_entry(self) -> HistoryEntry | None:
        entry_id = self.selected_id()
        return None if entry_id is None else self._entries.get(entry_id)

    def select_entry(self, entry_id: int) -> None:
        for row in range(self.table.rowCount()):
            if self.table.item(row, COL_TIME).data(ENTRY_ID) == entry_id:
                self.table.selectRow(row)
                return

    def _update_buttons(self) -> None:
        entry = self.selected_entry()
        for button in (self.copy_button, self.retype_button, self.delete_button):
            button.setEnabled(entry is not None)
        pending = entry is not None and entry.outcome == Outcome.PENDING
        self.edit_button.setEnabled(entry is not None and not pending)
        self.edit_button.setToolTip(
            "This dictation is still being transcribed; correct it when its text is in."
            if pending
            else "Correct the text (F2). Personalise learns from corrected dictations."
        )
        has_audio = entry is not None and entry.audio_path is not None and Path(entry.audio_path).is_file()
        busy = entry is not None and entry.id in self._retranscribing
        self.retranscribe_button.setEnabled(has_audio and not busy)
        if entry is not None and not has_audio:
            self.retranscribe_button.setToolTip("The recording of this dictation is no longer kept.")
        elif busy:
            self.retranscribe_button.setToolTip("This recording is being transcribed again.")
        else:
            self.retranscribe_button.setToolTip(
                "Run the saved recording through the current model, adapters and vocabulary again."
            )
        if self._playing is not None:
            self.play_button.setText("Stop")
            self.play_button.setEnabled(True)
            self.play_button.setToolTip("Stop playing the recording.")
        else:
            self.play_button.setText("Play")
            self.play_button.setEnabled(has_audio)
            self.play_button.setToolTip(
                "Listen to the saved recording of this dictation."
                if has_audio or entry is None
                else "The recording of this dictation is no longer kept."
            )

    # --- the line under the table -----------------------------------------------------------------

    def show_message(self, text: str, *, error: bool = False) -> None:
        """Say ``text`` under the table: a confirmation fades after a few seconds, an error stays."""
        self.message.setStyleSheet(ERROR_STYLE if error else "")
        self.message.setText(text)
        if error:
            self._message_timer.stop()
        else:
            self._message_timer.start()

    def message_text(self) -> str:
        return self.message.text()

    # --- actions ----------------------------------------------------------------------------------

    def copy_selected(self) -> None:
        entry_id = self.selected_id()
        if entry_id is not None:
            self.copy_entry(entry_id)

    def copy_entry(self, entry_id: int) -> None:
        if self.controller.copy_entry(entry_id):
            self.show_message("Copied to the clipboard.")
        else:
            self.show_message("Could not put the text on the clipboard.", error=True)

    def retype_selected(self) -> None:
        entry_id = self.selected_id()
        if entry_id is None:
            return
        # Hidden first, so the window the user was writing in gets the focus back and receives the text.
        self.hide()
        self.controller.retype_entry(entry_id)

    def edit_selected(self) -> None:
        """Open the selected entry's text to correct it; saving goes through the history worker."""
        entry = self.selected_entry()
        if entry is None or not self.edit_button.isEnabled():
            return
        dialog = EditDialog(self._drafts.get(entry.id, entry.text), local_time(entry.created), self)
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return
        text = dialog.text()
        if text == entry.text and entry.corrected and entry.id not in self._drafts:
            return  # nothing changed
        self.save_correction(entry.id, text)

    def save_correction(self, entry_id: int, text: str) -> None:
        """Save ``text`` as the entry's corrected transcript (answered through `_on_corrected`)."""
        self._drafts[entry_id] = text  # kept until the history has it
        if entry_id in self._entries:
            self._before.setdefault(entry_id, self._entries[entry_id])
        self.controller.correct_entry(entry_id, text)

    def _on_corrected(self, entry_id: int, error: str) -> None:
        if entry_id not in self._drafts:
            return
        if error:
            self.show_message(
                f"The correction was not saved: {error}. Press Edit again to retry; your text is kept.", error=True
            )
            return
        text = self._drafts.pop(entry_id)
        before = self._before.pop(entry_id, None)
        self.reload()
        self.show_message("Correction saved. Personalise can learn from it.")
        if before is not None:
            self._learn_words(before, text)

    # --- words for the vocabulary -----------------------------------------------------------------

    def _learn_words(self, before: HistoryEntry, text: str) -> None:
        """Offer (or add) the names and terms of a saved correction, as the settings say."""
        transcription = self.controller.settings.transcription
        if transcription.learn_from_corrections == "off":
            return
        words = new_words(before.text, text, vocabulary_terms(transcription))
        if not words:
            return
        if transcription.learn_from_corrections == "add":
            self.add_to_vocabulary(before.id, before.created, words)
        else:
            self.vocabulary_offer.offer(before.id, before.created, words)

    def add_to_vocabulary(self, entry_id: int, created: datetime, words: list[NewWord]) -> None:
        """Add ``words`` from the correction of entry ``entry_id`` to the learned words, and say so."""
        settings = self.controller.settings
        transcription, added = learn(settings.transcription, words, entry_id=entry_id, dictated=created)
        if not added:
            self.show_message("The vocabulary is full or has these words; nothing was added.", error=True)
            return
        errors = self.controller.apply_settings(settings.replace(transcription=transcription))
        if errors:
            self.show_message(f"The words were not added: {errors[0].message}", error=True)
            return
        self.show_message(f"Added to the vocabulary: {', '.join(added)} (Settings → Vocabulary lists them).")

    def retranscribe_selected(self) -> None:
        entry = self.selected_entry()
        if entry is None or not self.retranscribe_button.isEnabled():
            return
        if entry.corrected:
            answer = QMessageBox.question(
                self,
                "Transcribe again",
                "You corrected this dictation. Transcribing it again replaces your text with the model's, "
                "and Personalise no longer learns from it. Transcribe it again?",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                QMessageBox.StandardButton.No,
            )
            if answer != QMessageBox.StandardButton.Yes:
                return
        self._retranscribing.add(entry.id)
        self.busy.show()
        self.show_message(f"Transcribing the recording from {local_time(entry.created)} again…")
        self._message_timer.stop()  # stays until the result
        self._update_buttons()
        self.controller.retranscribe_entry(entry.id)  # answers through retranscribed (maybe at once)

    def _on_retranscribed(self, entry_id: int, error: str) -> None:
        if entry_id not in self._retranscribing:
            return
        self._retranscribing.discard(entry_id)
        self.busy.setVisible(bool(self._retranscribing))
        if error:
            self.show_message(error, error=True)
        else:
            self.reload()
            self.select_entry(entry_id)
            self.show_message("Transcribed again; the text is updated.")
        self._update_buttons()

    def toggle_playback(self) -> None:
        """Play the selected entry's recording, or stop the one playing."""
        if self._playing is not None:
            self.player.stop()
            return
        entry = self.selected_entry()
        if entry is None or entry.audio_path is None or not Path(entry.audio_path).is_file():
            return
        self._playing = entry.id
        self.show_message(f"Playing the recording from {local_time(entry.created)}…")
        self._message_timer.stop()
        self._update_buttons()
        self.player.play(entry.audio_path, self._playback_ended.emit)

    def _on_playback_ended(self, error: str) -> None:
        self._playing = None
        if error:
            self.show_message(error, error=True)
        else:
            self.message.clear()
        self._update_buttons()

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        if self._playing is not None:
            self.player.stop()  # closing the window ends the sound too

    def delete_selected(self) -> None:
        entry = self.selected_entry()
        if entry is None:
            return
        preview = entry.text if len(entry.text) <= 80 else entry.text[:79] + "…"
        answer = QMessageBox.question(
            self,
            "Delete dictation",
            f"Delete this dictation from the history?\n\n“{preview}”",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.controller.delete_entry(entry.id)

    def bring_forward(self) -> None:
        self.setWindowState(self.windowState() & ~Qt.WindowState.WindowMinimized)
        self.show()
        self.raise_()
        self.activateWindow()
