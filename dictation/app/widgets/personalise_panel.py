"""`PersonalisePanel`: the Personalise… button with its progress bar, Cancel and outcome line.

The History window and the Model page each show one over the controller's `Personaliser`
(`dictation.app.personalise`), so both follow the same training. The button is disabled with the
reason in its tooltip and on the line beside it (no model, no corrected dictation with a
recording, a training already running); pressing it asks first, then trains in the background
with the step, loss and time left shown, and Cancel. The outcome (the before/after figures, or
the one-line error) stays on the line until the next training.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QMessageBox, QProgressBar, QPushButton, QVBoxLayout, QWidget

from dictation.app.personalise import duration_text
from dictation.app.widgets.fields import ERROR_STYLE, WrappedLabel

MUTED_STYLE = "color: palette(mid);"  # why the button is disabled: a hint, not an error


class PersonalisePanel(QWidget):
    def __init__(self, personaliser: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.personaliser = personaliser
        self.button = QPushButton("Personalise…")
        self.button.clicked.connect(self.request)
        self.bar = QProgressBar()
        self.bar.setMinimumWidth(160)
        self.bar.setRange(0, 0)
        self.bar.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop training; no adapter is made.")
        self.cancel_button.clicked.connect(personaliser.cancel)
        self.cancel_button.hide()
        self.line = WrappedLabel()
        self.line.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.button)
        row.addWidget(self.bar)
        row.addWidget(self.cancel_button)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.line)
        personaliser.changed.connect(self.update_state)
        personaliser.progress.connect(self._on_progress)
        personaliser.status.connect(self._on_status)
        personaliser.finished.connect(lambda _message, _error: self.update_state())
        self.update_state()

    def text(self) -> str:
        """The line beside the button (status, progress, outcome or why it cannot start)."""
        return self.line.text()

    def request(self) -> None:
        """Ask, then start training (the button)."""
        p = self.personaliser
        if p.unavailable_reason():
            return
        device = p.controller.settings.engine.device
        where = "the CPU" if device == "cpu" else "the GPU if there is one" if device == "auto" else device
        answer = QMessageBox.question(
            self,
            "Personalise",
            f"{p.describe()}\n\nTraining runs in the background on {where} and may take many minutes; "
            "dictation keeps working meanwhile, more slowly. Cancel stops it and leaves no adapter.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.Yes,
        )
        if answer == QMessageBox.StandardButton.Yes:
            p.start()

    def update_state(self) -> None:
        p = self.personaliser
        running = p.running
        reason = p.unavailable_reason()
        self.button.setEnabled(reason is None)
        self.button.setToolTip(reason or p.describe())
        self.bar.setVisible(running)
        self.cancel_button.setVisible(running)
        self.cancel_button.setEnabled(running and not p.cancelling)
        if running:
            return  # the line follows the training's status and progress
        self.bar.setRange(0, 0)
        if p.last_message:
            self._say(p.last_message, error=p.last_error)
        else:
            self._say(reason or "", muted=True)

    def _on_progress(self, step: int, steps: int, loss: float, seconds_left: float) -> None:
        if steps > 0:
            self.bar.setRange(0, steps)
            self.bar.setValue(step)
            self.bar.setFormat(f"Step {step} of {steps}")
        left = f", about {duration_text(seconds_left)} left" if seconds_left > 0 else ""
        if not self.personaliser.cancelling:
            self._say(f"Training: loss {loss:.3f}{left}.")

    def _on_status(self, text: str) -> None:
        if self.personaliser.running:
            self._say(text)

    def _say(self, text: str, *, error: bool = False, muted: bool = False) -> None:
        self.line.setStyleSheet(ERROR_STYLE if error else MUTED_STYLE if muted else "")
        self.line.setText(text)
