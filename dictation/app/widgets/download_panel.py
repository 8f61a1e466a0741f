"""Progress of a model download: what is being fetched, how far, a Cancel button, and how it ended."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from dictation.app.widgets.fields import ERROR_STYLE, WrappedLabel, style_as_help

RESUME_NOTE = "Interrupted or cancelled downloads resume where they stopped the next time."


def format_bytes(n: int) -> str:
    if n >= 10**9:
        return f"{n / 10**9:.2f} GB"
    if n >= 10**6:
        return f"{n / 10**6:.0f} MB"
    return f"{n / 10**3:.0f} kB"


class DownloadPanel(QFrame):
    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.repo_id = ""
        self._running = False
        layout = QVBoxLayout(self)
        self.title = QLabel()
        layout.addWidget(self.title)
        row = QHBoxLayout()
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        row.addWidget(self.bar, 1)
        self.amount = QLabel()
        row.addWidget(self.amount)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self._cancel)
        row.addWidget(self.cancel_button)
        layout.addLayout(row)
        self.result = WrappedLabel()
        layout.addWidget(self.result)
        self.note = WrappedLabel(RESUME_NOTE)
        style_as_help(self.note)
        layout.addWidget(self.note)
        self.hide()

    @property
    def running(self) -> bool:
        return self._running

    def start(self, repo_id: str) -> None:
        self.repo_id = repo_id
        self._running = True
        self.title.setText(f"Downloading {repo_id} into the Hugging Face cache…")
        self.bar.setRange(0, 0)  # busy until the first progress report with a size
        self.bar.show()
        self.amount.setText("")
        self.cancel_button.setEnabled(True)
        self.cancel_button.show()
        self.result.hide()
        self.show()

    def set_progress(self, done: int, total: int) -> None:
        if not self._running:
            return
        if total > 0:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(1000 * min(done, total) / total))
            self.amount.setText(f"{format_bytes(done)} of {format_bytes(total)}")
        else:
            self.bar.setRange(0, 0)
            self.amount.setText(format_bytes(done))

    def percent(self) -> int:
        """How far the bar shows the download, 0..100 (0 while the size is unknown)."""
        if self.bar.maximum() == 0:
            return 0
        return round(100 * self.bar.value() / self.bar.maximum())

    def finish(self, error: str) -> None:
        self._running = False
        self.bar.hide()
        self.amount.setText("")
        self.cancel_button.hide()
        if not error:
            self.title.setText(f"Downloaded {self.repo_id}.")
            self.result.setStyleSheet("")
            self.result.setText("The model is in the cache and selected; it loads in the background.")
        elif error == "cancelled":
            self.title.setText(f"Download of {self.repo_id} cancelled.")
            self.result.setStyleSheet("")
            self.result.setText("What was downloaded so far is kept.")
        else:
            self.title.setText(f"Download of {self.repo_id} failed.")
            self.result.setStyleSheet(ERROR_STYLE)
            self.result.setText(error)
        self.result.show()
        self.show()

    def _cancel(self) -> None:
        self.cancel_button.setEnabled(False)
        self.title.setText(f"Cancelling the download of {self.repo_id}…")
        self.cancel_requested.emit()
