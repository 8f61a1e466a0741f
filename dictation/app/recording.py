"""`Recording`: the microphone and the take being recorded, for the controller (`AppController.recording`).

While a take records it polls the audio worker for the level (the overlay) and for a lost device or
a full buffer (session events); it hears that the microphone records (`started`: the take's file,
a late start told to the user and to a waiting `dictation start`) or could not start, and it keeps
the live preview of the take (never typed). The audio worker's signals reach it on the GUI thread
(routed by `dictation.app.worker_port`); what it reads and tells the app is `RecordingApp`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, QTimer

from dictation import session as S
from dictation.app.options import late_start_message
from dictation.takes import LATE_START_S

if TYPE_CHECKING:
    from dictation.app.commands import Commands
    from dictation.app.hotkey_input import HotkeyInput
    from dictation.config import Settings
    from dictation.takes import Emits, Takes

log = logging.getLogger("dictation.app.controller")  # the controller's part: its log lines stay its own

RECORDER_POLL_MS = 100


class RecordingApp(Protocol):
    """What `Recording` reads and tells (the controller)."""

    session: S.DictationSession
    takes: Takes
    commands: Commands

    @property
    def settings(self) -> Settings: ...
    @property
    def keys(self) -> HotkeyInput: ...
    @property
    def input_level_changed(self) -> Emits: ...
    @property
    def preview_changed(self) -> Emits: ...

    def dispatch(self, event: Any) -> None: ...
    def notify(self, level: str, message: str, *, log_as: str | None = None) -> None: ...


class Recording(QObject):
    """The microphone's side of a take on the GUI thread. A QObject (a child of ``parent``, the
    controller) so its timer's slot does not keep the controller alive."""

    def __init__(self, app: RecordingApp, audio: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._app = app
        self._audio = audio  # the AudioWorker: its thread-safe reads (level, errors) are called here
        self.preview_text = ""  # the latest live preview of the take being recorded ("" none)
        self._poll = QTimer(self)
        self._poll.setInterval(RECORDER_POLL_MS)
        self._poll.timeout.connect(self._poll_recorder)

    def wait_ready(self, timeout: float) -> bool:
        """Block until the microphone was opened (or failed to open) and has heard a pre-roll's
        worth, so the first press gets its pre-roll too, and the hotkeys listen; at most ``timeout``
        seconds. False if that was not reached in time."""
        audio = self._audio
        deadline = time.monotonic() + timeout
        ready = audio.wait_configured(timeout)
        ready = self._app.keys.wait_ready(max(0.0, deadline - time.monotonic())) and ready
        while (heard := audio.heard_s()) is not None and heard < audio.pre_roll_s():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return ready

    def level(self) -> float:
        from dictation.audio.capture import meter_fraction

        return meter_fraction(self._audio.level())

    def devices(self) -> list[Any]:
        from dictation.audio.devices import AudioDeviceError, list_input_devices

        try:
            return list_input_devices()
        except AudioDeviceError as exc:
            log.warning("cannot list microphones: %s", exc)
            return []

    def begin(self) -> None:
        """A take starts recording: no preview yet, the level polled."""
        self.set_preview("")
        self._poll.start()

    def status(self, status: S.Status) -> None:
        if status is not S.Status.RECORDING:
            self._poll.stop()
            self._app.input_level_changed.emit(0.0)
        if status in (S.Status.IDLE, S.Status.ERROR):
            self.set_preview("")

    def stop(self) -> None:
        self._poll.stop()

    def _poll_recorder(self) -> None:
        """While recording: the level for the overlay, and a lost device or a full buffer."""
        audio = self._audio
        self._app.input_level_changed.emit(self.level())
        take_id = self._app.session.recording_take_id
        if take_id is None:
            return
        error = audio.recorder_error()
        if error:
            self._app.dispatch(S.RecordingLost(take_id, error, partial_audio_available=True))
        elif audio.limit_reached():
            self._app.dispatch(S.MaxLengthReached(take_id))

    # ---- the audio and engine workers' answers (routed onto the GUI thread) --------------------------

    def started(self, take_id: int, path: Any, gap: float | None = None) -> None:
        """The mic is live and the take is being written to ``path``: its history entry comes next.
        ``gap``: the take's first sample minus the press (the take's `start_gap_s`, as far as known
        now); above `LATE_START_S` words after the press are missing, and the user is told."""
        app = self._app
        wanted = app.takes.started(take_id, path)  # not if it was discarded before it even started
        extra: dict = {}
        keep_open = app.settings.recording.keep_mic_open
        if gap is not None and gap > LATE_START_S and wanted:
            warning = late_start_message(gap, keep_open)
            extra = {"late_ms": round(gap * 1000), "warning": warning}
            if keep_open:
                app.notify("warning", warning)
            else:  # the user chose a microphone that opens at each press; the settings say what it costs
                log.info("take %d: %s", take_id, warning)
        app.commands.answer_start(take_id, extra)
        app.dispatch(S.RecordingStarted(take_id))

    def start_failed(self, take_id: int, message: str) -> None:
        app = self._app
        app.commands.answer_start(take_id, {"ok": False, "message": f"Could not start recording: {message}"})
        app.takes.discard(take_id)
        app.dispatch(S.RecordingFailed(take_id, message))

    def open_failed(self, message: str) -> None:
        self._app.notify("warning", f"Microphone: {message}")

    def preview(self, take_id: int, text: str) -> None:
        if take_id == self._app.session.recording_take_id and self._app.settings.general.live_preview:
            self.set_preview(text)

    def set_preview(self, text: str) -> None:
        if text != self.preview_text:
            self.preview_text = text
            self._app.preview_changed.emit(text)
