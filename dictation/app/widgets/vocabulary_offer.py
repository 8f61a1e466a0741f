"""The offer under the history's table after a correction: the new names and terms in it, each with a check
box, "Add to vocabulary" and "Not now". Which words count: `dictation.vocabulary.new_words`; what adding
does: `dictation.vocabulary.learn` (the history window applies it)."""

from __future__ import annotations

from datetime import datetime

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QFrame, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from dictation.app.widgets.fields import WrappedLabel
from dictation.vocabulary import NewWord


class VocabularyOffer(QFrame):
    """Hidden until `offer`; ``accepted(entry_id, created, words)`` with the words left checked."""

    accepted = Signal(int, object, object)  # entry id, the dictation's datetime, list[NewWord]

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.note = WrappedLabel()
        self.checks: list[QCheckBox] = []
        self._words: list[NewWord] = []
        self._entry: tuple[int, datetime] | None = None
        self._boxes = QHBoxLayout()
        self.add_button = QPushButton("Add to vocabulary")
        self.add_button.setToolTip("The model is given these words with your vocabulary (Settings → Vocabulary).")
        self.add_button.clicked.connect(self._accept)
        self.dismiss_button = QPushButton("Not now")
        self.dismiss_button.clicked.connect(self.dismiss)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.dismiss_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.note)
        layout.addLayout(self._boxes)
        layout.addLayout(buttons)
        self.hide()

    def offer(self, entry_id: int, created: datetime, words: list[NewWord]) -> None:
        """Show ``words`` (all checked) from the correction of entry ``entry_id``, replacing any earlier offer."""
        while self._boxes.count():  # the earlier offer's boxes and stretch
            item = self._boxes.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.checks = []
        self._words = list(words)
        self._entry = (entry_id, created)
        for new in self._words:
            check = QCheckBox(new.word.replace("&", "&&"))  # "AT&T", not a shortcut letter
            check.setChecked(True)
            check.setToolTip(f"The model had written “{new.heard}”." if new.heard else "The model had left it out.")
            check.toggled.connect(self._update)
            self._boxes.addWidget(check)
            self.checks.append(check)
        self._boxes.addStretch(1)
        self.note.setText(
            "New words in your correction. Add them to the vocabulary, so the model prefers them from now on?"
        )
        self._update()
        self.show()

    def offered(self) -> list[str]:
        return [new.word for new in self._words] if self.isVisible() else []

    def checked(self) -> list[NewWord]:
        return [new for new, check in zip(self._words, self.checks, strict=True) if check.isChecked()]

    def _update(self) -> None:
        self.add_button.setEnabled(bool(self.checked()))

    def _accept(self) -> None:
        words = self.checked()
        if self._entry is None or not words:
            return
        entry_id, created = self._entry
        self.dismiss()
        self.accepted.emit(entry_id, created, words)

    def dismiss(self) -> None:
        self.hide()
        self._entry = None
