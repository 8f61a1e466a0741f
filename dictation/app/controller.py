"""The app's wiring: every input becomes a session event, every session action becomes work.

`AppController` lives on the GUI thread. It owns the `DictationSession` (the lifecycle rules, see
`dictation.session`), the settings, the history, the global hotkeys, and the workers on their own
threads (engine, audio, output, history, download). Windows and the tray talk only to it, through
the methods and signals below, so they can be tested against a fake with the same face.

Event flow: hotkey thread / tray / IPC / worker signal -> `dispatch(event)` -> `session.handle`
-> actions performed in order (`_perform`). Events raised while actions run are queued, so the
actions of one event always run before the next event is handled.

The workers are reached through one port (`worker_port.WorkerPort`, ``self.workers``): each call is
queued onto the worker's own thread, in order; each worker's result signal is routed onto the GUI
thread straight to the one who handles it (`_wire_workers`). Its parts: `Takes` (``self.takes``,
`dictation.takes`: every take, from the press to its text), `ModelLifecycle` (``self.model``),
`Recording` (``self.recording``: the microphone's side of a take), `Commands` (``self.commands``:
`dictation <command>`), `Cues` (the sounds). One take, top to bottom: docs/app.md.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QGuiApplication

from dictation import session as S
from dictation.app.commands import Commands
from dictation.app.cues import Cues
from dictation.app.history_worker import HistoryWorker
from dictation.app.hotkey_input import CANCEL, DICTATE, HotkeyInput
from dictation.app.model_lifecycle import NO_MODEL_MESSAGE, ModelLifecycle
from dictation.app.options import engine_key, output_options, session_settings
from dictation.app.personalise import Personaliser
from dictation.app.recording import Recording
from dictation.app.services import Services, recorder_config
from dictation.app.worker_port import WorkerPort
from dictation.config import History, Settings
from dictation.config.schema import FieldError, validate
from dictation.takes import Retype, Takes

log = logging.getLogger(__name__)

DISCARDED_MESSAGE = "the recording was discarded (cancelled, or stopped too soon)"


class AppController(QObject):
    status_changed = Signal(object)  # session.Status
    settings_changed = Signal(object)  # Settings, after it was saved and applied
    model_label_changed = Signal(str)
    model_progress = Signal(str)
    history_changed = Signal()
    log_record = Signal(object)
    download_progress = Signal(str, "qlonglong", "qlonglong")  # 64-bit: models exceed 2 GiB
    download_finished = Signal(str, str)
    notified = Signal(str, str)  # level ("info", "warning", "error"), message: shown by the tray
    show_settings_requested = Signal(str)  # page name
    show_history_requested = Signal()
    quit_requested = Signal()
    hotkeys_paused_changed = Signal(bool)
    input_level_changed = Signal(float)  # 0..1 while recording, for the overlay
    preview_changed = Signal(str)  # live preview of the take being recorded ("" clears it); never typed
    retranscribed = Signal(int, str)  # history entry id, "" when its text was replaced, else why not
    corrected = Signal(int, str)  # history entry id, "" when the user's text was saved, else why not

    def __init__(self, services: Services, settings: Settings | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._s = services
        self._settings = settings if settings is not None else services.store.load()
        self._clock = services.clock
        model_state = S.ModelState.LOADING if self._settings.engine.model else S.ModelState.NOT_CHOSEN
        self.session = S.DictationSession(session_settings(self._settings), model_state=model_state)
        self._status = self.session.status
        self._queue: collections.deque[Any] = collections.deque()
        self._dispatching = False
        self._event_t = 0.0
        self._keys = HotkeyInput(self._clock, self, hold=getattr(services.output_worker, "hold", None))
        self._output_description = "text output: not configured yet"
        self._cues = Cues(services.sound_factory, services.audio_worker.mark_cue)
        self.left_running: list[Any] = []  # threads quitting did not wait for (the busy engine): main.run
        self._log_bridge: Any = None
        self._started = False
        self._held_notes: list[tuple[str, str]] | None = None  # notes before the windows exist (start_input)
        self._history_worker = services.history_worker or HistoryWorker.for_history(
            services.history, self._settings.general.history_size
        )
        s = services  # the one way to the workers' threads, and back (worker_port.py)
        self.workers = WorkerPort(
            s.engine_worker, s.audio_worker, s.output_worker, self._history_worker, s.download_worker
        )
        self.takes = Takes(self, self.workers)  # every take under way, and the history's re-transcriptions
        self.model = ModelLifecycle(self, self.workers.engine, self)  # the speech model's life
        self.commands = Commands(self, self._clock, self)  # `dictation <command>`
        self.recording = Recording(self, services.audio_worker, self)  # the microphone's side of a take
        self.personaliser = Personaliser(self, **services.personalise)  # trains on its own thread

        self._keys.event.connect(self._on_hotkey)
        self._keys.problem.connect(self.notify)

    # ---- start / stop -------------------------------------------------------------------------

    def start_input(self) -> None:
        """What a press needs, before anything slow (the windows, the model): the history and audio
        threads, the microphone opened ahead of time, the hotkeys listening. A press from now on is
        honoured from its time (the microphone's pre-roll ring reaches back to it) even though it is
        handled only once the event loop runs. Notifications wait for `start` (the tray shows them)."""
        if self._started:
            return
        self._started = True
        self._held_notes = []
        self._wire_workers()
        self.workers.start("history")
        self.workers.history.open()  # first: replay what was kept aside, find interrupted takes
        self.workers.start("audio")
        self.workers.audio.configure(recorder_config(self._settings))
        self._start_hotkeys()

    def wait_input_ready(self, timeout: float) -> bool:
        """Block until the microphone heard a pre-roll's worth and the hotkeys listen (`Recording.wait_ready`)."""
        return self.recording.wait_ready(timeout)

    def start(self) -> None:
        """Everything else: the engine, output and download threads, the sounds, the model's load
        (after `start_input`, which it runs first if it has not run)."""
        s = self._s
        self.start_input()
        self.workers.start("engine", "output", "download")
        held, self._held_notes = self._held_notes or [], None
        for level, message in held:
            self.notified.emit(level, message)
        self._cues.start(self._settings)
        if getattr(s.output_worker, "own_window", False) is None:
            from dictation.app.focus import OwnFocus

            s.output_worker.own_window = OwnFocus(self)  # nothing is pasted into our own windows
        self.workers.output.configure(output_options(self._settings))
        if self._settings.engine.model:
            self.model.request_load()
        else:
            log.warning("%s", NO_MODEL_MESSAGE)
            self.model_progress.emit(NO_MODEL_MESSAGE)
        self.status_changed.emit(self._status)

    def shutdown(self) -> None:
        """Stop hotkeys and workers; put a pending clipboard back (OutputChain.flush)."""
        if not self._started:
            return
        self._started = False
        self.personaliser.shutdown()  # a training is cancelled, its thread waited for
        self.commands.stop()  # a `start` still waiting is answered
        self._keys.stop()
        self._s.engine_worker.interrupt_all()  # a running live preview ends now
        self.recording.stop()
        self.model.stop()
        self._cues.close()
        self._s.download_worker.cancel()
        self.left_running = self.workers.stop(self)  # after handling what they queued for us (worker_port.py)

    def _wire_workers(self) -> None:
        """Each worker's result signal, routed onto the GUI thread to the one who handles it; the
        audio worker also hands its chunks and saved takes straight to the engine worker's thread."""
        s, takes, model, route = self._s, self.takes, self.model, self.workers.gui.route
        e, a, o, d, h = s.engine_worker, s.audio_worker, s.output_worker, s.download_worker, self._history_worker
        a.chunk_ready.connect(e.feed)  # audio thread -> engine thread directly, in order
        a.saved.connect(e.take_saved)  # likewise: the saved take, before the GUI thread hears of it
        for signal, handler in (
            (e.loading, model.loading),
            (e.loaded, model.loaded),
            (e.load_failed, model.load_failed),
            (e.adapters_failed, model.adapters_failed),
            (e.adapters_skipped, model.adapters_skipped),
            (e.kept_previous, model.kept_previous),
            (e.moved_to_cpu, model.moved_to_cpu),
            (e.unloaded, model.unloaded),
            (e.transcribed, takes.transcribed),
            (e.transcribe_failed, takes.transcribe_failed),
            (e.no_speech, takes.no_speech),
            (e.preview_ready, self.recording.preview),
            (a.started, self.recording.started),
            (a.start_failed, self.recording.start_failed),
            (a.saved, takes.saved),
            (a.open_failed, self.recording.open_failed),
            (o.delivered, takes.delivered),
            (o.described, self._on_output_described),
            (d.progress, self.download_progress.emit),
            (d.finished, self._on_download_finished),
            (h.ready, takes.entry_ready),
            (h.stored, takes.stored),
            (h.changed, self.history_changed.emit),
            (h.recovered, takes.recovered),
            (h.problem, self.notify),
            (h.corrected, self.corrected.emit),
        ):
            route(signal, handler)

    # ---- the face used by the tray, windows and IPC --------------------------------------------

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def history(self) -> History:
        return self._s.history

    @property
    def status(self) -> S.Status:
        return self._status

    @property
    def model_label(self) -> str:
        return self.model.label

    @property
    def model_state_text(self) -> str:
        return self.model.state_text

    @property
    def model_ready(self) -> bool:
        return self.session.model_state is S.ModelState.READY

    @property
    def running(self) -> bool:
        """False once quitting began (the output worker has stopped)."""
        return self._started

    @property
    def keys(self) -> HotkeyInput:
        return self._keys

    def handle_ipc(
        self, command: str, sent: float | None = None, answer: Callable[[dict], None] | None = None
    ) -> dict | None:
        """`dictation <command>` (`Commands.handle_ipc`)."""
        return self.commands.handle_ipc(command, sent, answer)

    @property
    def hotkeys_paused(self) -> bool:
        return self._keys.paused

    @property
    def preview_text(self) -> str:
        """The latest live preview of the take being recorded (or just released); "" when none."""
        return self.recording.preview_text

    def attach_log(self, bridge: Any) -> None:
        self._log_bridge = bridge
        bridge.attach(self.log_record, lambda problem: self.notify("warning", problem))

    def recent_log(self) -> list[logging.LogRecord]:
        return list(self._log_bridge.records) if self._log_bridge is not None else []

    def toggle(self) -> None:
        self.dispatch(S.ToggleRequested(self._clock()))

    def cancel_dictation(self) -> None:
        self.dispatch(S.CancelRequested())

    def keep_settings(self, settings: Settings) -> bool:
        """Save and adopt ``settings`` without applying them (the engine already runs so); False if
        they could not be saved (they are adopted all the same, for this run)."""
        saved = True
        try:
            self._s.store.save(settings)
        except (OSError, ValueError) as exc:  # SettingsError is a ValueError
            log.warning("cannot save the settings (%s): they hold for this run only", exc)
            saved = False
        self._settings = settings
        self.settings_changed.emit(settings)
        return saved

    def apply_settings(self, settings: Settings) -> list[FieldError]:
        errors = validate(settings)
        if errors:
            return errors
        old = self._settings
        if settings == old:
            return []
        self._s.store.save(settings)
        self._settings = settings
        self._apply(old, settings)
        self.settings_changed.emit(settings)
        return []

    def input_level(self) -> float:
        return self.recording.level()

    def input_devices(self) -> list[Any]:
        return self.recording.devices()

    def hotkey_description(self) -> str:
        return self._keys.describe()

    def output_description(self) -> str:
        return self._output_description

    def set_hotkeys_paused(self, paused: bool) -> None:
        if self._keys.set_paused(paused, recording=self._status is S.Status.RECORDING):
            self.hotkeys_paused_changed.emit(paused)

    def copy_entry(self, entry_id: int) -> bool:
        """Put the entry's text on the clipboard; True if the clipboard now holds it."""
        entry = self.history.get(entry_id)
        if entry is None:
            return False
        clipboard = QGuiApplication.clipboard()
        clipboard.setText(entry.text)
        return clipboard.text() == entry.text

    def retype_entry(self, entry_id: int) -> None:
        entry = self.history.get(entry_id)
        if entry is None or not entry.text:
            return
        # Give the focus a moment to return to the user's window after our window hides.
        QTimer.singleShot(400, lambda: self.workers.output.type_text(Retype(entry_id), entry.text))

    def delete_entry(self, entry_id: int) -> None:
        self.workers.history.delete_entry(entry_id)  # history_changed follows once it is done

    def correct_entry(self, entry_id: int, text: str) -> None:
        """Replace an entry's text with the user's and mark it corrected; `corrected` tells how it went."""
        self.workers.history.correct_entry(entry_id, text)  # history_changed follows once it is saved

    def retranscribe_entry(self, entry_id: int) -> None:
        """Transcribe a history entry's recording again; `retranscribed` tells how it went."""
        self.takes.retranscribe(entry_id)

    def start_download(self, repo_id: str) -> None:
        self.workers.download.run(repo_id)

    def cancel_download(self) -> None:
        self._s.download_worker.cancel()

    # ---- settings -----------------------------------------------------------------------------

    def _apply(self, old: Settings, new: Settings) -> None:
        if session_settings(old) != session_settings(new):
            self.dispatch(S.SettingsChanged(session_settings(new)))
        if self._started:
            if recorder_config(old) != recorder_config(new):
                self.workers.audio.configure(recorder_config(new))
            if old.output != new.output:
                self.workers.output.configure(output_options(new))
            if old.hotkeys != new.hotkeys:
                self._keys.stop()
                self._start_hotkeys()
            if old.recording != new.recording:
                self._cues.update(new)
            if engine_key(old) != engine_key(new):
                self.model.cpu_fallback = False
                if new.engine.model:
                    self.model.request_load()
                else:
                    self.model.unload()
        if old.general.history_size != new.general.history_size:
            self.workers.history.set_max_entries(new.general.history_size)
        if old.general.start_at_login != new.general.start_at_login:
            self._set_autostart(new.general.start_at_login)
        self.model.idle()

    def _set_autostart(self, enabled: bool) -> None:
        from dictation import autostart

        try:
            path = autostart.set_enabled(enabled)
        except OSError as exc:
            self.notify("error", f"Could not change start at login: {exc}")
            return
        log.info("start at login %s (%s)", "enabled" if enabled else "disabled", path)

    # ---- hotkeys ------------------------------------------------------------------------------

    def _start_hotkeys(self) -> None:
        self._keys.start(self._settings.hotkeys, self._s.hotkey_chooser, recording=self._status is S.Status.RECORDING)

    def _on_hotkey(self, name: str, pressed: bool, t: float) -> None:
        if name == DICTATE:
            self.dispatch(S.HotkeyDown(t) if pressed else S.HotkeyUp(t))
        elif name == CANCEL and pressed:
            self.dispatch(S.CancelRequested())

    # ---- the session ----------------------------------------------------------------------------

    def dispatch(self, event: Any) -> None:
        self._queue.append(event)
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while self._queue:
                event = self._queue.popleft()
                self._event_t = getattr(event, "t", None) or self._clock()
                for action in self.session.handle(event):
                    self._perform(action)
        finally:
            self._dispatching = False

    def _perform(self, action: Any) -> None:
        if isinstance(action, S.StartCapture):
            take = self.takes.begin(action.take_id)
            if take.streaming:
                language, context = self.takes.language_context()
                self.workers.engine.begin_take(take.id, language, context, self._settings.general.live_preview)
            self.workers.audio.start(take.id, self._event_t, take.streaming)
            self.recording.begin()
        elif isinstance(action, S.StopCapture):
            self._s.engine_worker.interrupt(action.take_id)  # a running preview must not delay the text
            self.workers.audio.stop(action.take_id, self._event_t, self._settings.recording.trim_silence)
        elif isinstance(action, S.DiscardCapture):
            self._s.engine_worker.interrupt(action.take_id)
            self.recording.set_preview("")
            self.workers.audio.cancel(action.take_id)  # deletes the take's file
            self.commands.answer_start(action.take_id, {"message": DISCARDED_MESSAGE})  # a start not answered yet
            self.takes.discard(action.take_id)
        elif isinstance(action, S.LoadModel):
            if self._settings.engine.model:
                self.model.build_and_load()
            else:
                self._queue.append(S.ModelNotChosen())
        elif isinstance(action, S.Transcribe):
            self.takes.want_transcription(action.take_id)
        elif isinstance(action, S.SkipTranscription):
            self.takes.skip(action.take_id, action.reason)
        elif isinstance(action, S.DeliverText):
            self.takes.record_text(action)
        elif isinstance(action, S.ScheduleTick):
            delay = max(0, int((action.at_t - self._clock()) * 1000) + 1)
            QTimer.singleShot(delay, self, self._tick)  # a lambda would hold the controller until it fired
        elif isinstance(action, S.PlaySound):
            self._cues.play(action.kind.value)
        elif isinstance(action, S.Notify):
            self.notify(action.level.value, action.message)
        elif isinstance(action, S.ShowModelChoice):
            self.show_settings_requested.emit("model")
        elif isinstance(action, S.SetStatus):
            self._status = action.status
            self._keys.update(recording=action.status is S.Status.RECORDING)
            self.recording.status(action.status)
            self.model.idle()
            self.status_changed.emit(action.status)

    def _tick(self) -> None:
        self.dispatch(S.Tick(self._clock()))

    def notify(self, level: str, message: str, *, log_as: str | None = None) -> None:
        """Show ``message`` (the tray) and log it, or log ``log_as`` instead where the message
        quotes what the user said: no dictated word goes into the log."""
        {"info": log.info, "warning": log.warning}.get(level, log.error)("%s", message if log_as is None else log_as)
        if self._held_notes is not None:  # between start_input and start: no tray to show it yet
            self._held_notes.append((level, message))
            return
        self.notified.emit(level, message)

    # ---- the workers' answers the controller handles (routed onto the GUI thread) -------------------

    def _on_output_described(self, text: str) -> None:
        self._output_description = text

    def _on_download_finished(self, repo_id: str, folder: str, error: str) -> None:
        self.download_finished.emit(repo_id, error)
        if error == "cancelled":
            self.notify("info", f"Download of {repo_id} cancelled; it resumes where it stopped next time.")
        elif error:
            self.notify("error", f"Download of {repo_id} failed: {error}")
        else:
            self.notify("info", f"Downloaded {repo_id}.")
