"""The app's wiring: every input becomes a session event, every session action becomes work.

`AppController` lives on the GUI thread. It owns the `DictationSession` (the lifecycle rules, see
`dictation.session`), the settings, the history, the global hotkeys, and three workers on their own
threads (engine, audio, output; see `workers.py`). Windows and the tray talk only to it, through
the methods and signals below, so they can be tested against a fake with the same face.

Event flow: hotkey thread / tray / IPC / worker signal -> `_dispatch(event)` -> `session.handle`
-> actions performed in order (`_perform`). Events raised while actions run are queued, so the
actions of one event always run before the next event is handled.

Per take (one recording; `dictation.takes` keeps what is known of each and decides what follows):
StartCapture -> the audio worker starts writing the take to disk -> RecordingStarted, and the
history worker makes the take's entry (pending, no text, the path of its audio); StopCapture -> the
audio worker stops, saves the WAV whole, trims, and hands the saved take straight to the engine
worker (and tells the controller); Transcribe -> once the entry exists, the engine worker is told to
transcribe the take (it starts as soon as it has both) -> TranscriptionDone. With the model loaded
and ``engine.stream_while_recording`` on, a take is streamed: the engine worker is fed its audio
while it records (and shows live previews, `preview_changed`), the release interrupts a running
preview, and the saved take finishes the stream (see `engine_worker.py`); DeliverText -> text
options applied, the history worker stores the text (`stored`), only then the output worker types
it -> the history worker sets the outcome. Nothing a user said is lost: the audio is on disk while
it is recorded, the entry exists before transcription, the text is in the history (or its fallback
journal) before it is typed; if the recordings folder cannot be written, the take is transcribed
from memory. The GUI thread never writes to SQLite (`HistoryWorker`).
Takes a crash interrupted are transcribed at the next start into the history as "recovered",
never typed (`Takes.recovered`).
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication

from dictation import session as S
from dictation.app.commands import Commands
from dictation.app.history_worker import HistoryWorker
from dictation.app.hotkey_input import CANCEL, DICTATE, HotkeyInput
from dictation.app.model_lifecycle import NO_MODEL_MESSAGE, ModelLifecycle
from dictation.app.options import engine_key, engine_options, late_start_message, output_options, session_settings
from dictation.app.personalise import Personaliser
from dictation.app.takes_port import TakesPort
from dictation.app.workers import (
    AudioWorker,
    DownloadWorker,
    EngineWorker,
    OutputWorker,
    RecorderConfig,
    start_thread,
    stop_thread,
    stop_threads,
)
from dictation.config import History, Settings
from dictation.config.schema import FieldError, validate
from dictation.config.store import SettingsStore
from dictation.takes import LATE_START_S, Retranscription, Retype, SavedTake, Takes

log = logging.getLogger(__name__)

RECORDER_POLL_MS = 100
DISCARDED_MESSAGE = "the recording was discarded (cancelled, or stopped too soon)"
MINUTE_MS = 60_000  # idle-unload unit (tests shorten it)


def recorder_config(settings: Settings) -> RecorderConfig:
    r = settings.recording
    device = None if r.input_device in ("", "default") else r.input_device
    return RecorderConfig(device=device, max_seconds=float(r.max_seconds) + 5.0, keep_open=r.keep_mic_open)


@dataclass
class Services:
    """What the controller is built from; tests replace the parts that touch hardware."""

    store: SettingsStore
    history: History
    engine_worker: EngineWorker = field(default_factory=EngineWorker)
    audio_worker: AudioWorker = field(default_factory=AudioWorker)
    output_worker: OutputWorker = field(default_factory=OutputWorker)
    download_worker: DownloadWorker = field(default_factory=DownloadWorker)
    history_worker: HistoryWorker | None = None  # None: one writing to ``history``'s file
    hotkey_chooser: Callable[[str], Any] | None = None  # preference -> BackendChoice
    sound_factory: Callable[[Settings], Any] | None = None  # settings -> object with play(kind)
    clock: Callable[[], float] = time.monotonic
    personalise: dict[str, Any] = field(default_factory=dict)  # Personaliser's train, samples, options, adapters_dir


class AppController(ModelLifecycle, Commands, QObject):
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

    # queued calls into the worker threads
    _build_and_load = Signal(object)  # a callable returning EngineOptions, called on the engine thread
    _unload = Signal()
    _transcribe = Signal(object, object, object, str)  # Retranscription, samples, language, context
    _transcribe_take = Signal(int, object, str)  # take id, language, context
    _begin_take = Signal(int, object, str, bool)  # take id, language, context, live preview
    _warm_up = Signal()  # a loaded model's warm-up pass (EngineWorker.warm_up)
    _drop_take = Signal(int)  # take id: its stream and saved samples go
    _audio_configure = Signal(object)
    _audio_start = Signal(int, float, bool)
    _audio_stop = Signal(int, float, bool)
    _audio_cancel = Signal(int)
    _audio_close = Signal()
    _output_configure = Signal(object)
    _type_text = Signal(object, object)  # take id or Retype, text (a str, or an output.steps.Plan)
    _output_flush = Signal()
    _download = Signal(str)
    _history_open = Signal()
    _history_begin = Signal(int, object)  # take id, path of the take's file (or None)
    _history_store = Signal(int, object)  # take id, fields (text first: before it is typed)
    _history_finish = Signal(int, object, bool, int)  # take id, fields, delete the audio, recordings kept
    _history_discard = Signal(int, bool, int)  # take id, delete the audio, recordings kept
    _history_update = Signal(int, object)  # entry id, fields
    _history_delete = Signal(int)
    _history_correct = Signal(int, str)  # entry id, the user's text
    _history_size = Signal(int)
    _history_drain = Signal()  # blocking: returns once the history worker did everything queued
    _history_close = Signal()  # blocking

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
        self.takes = Takes(TakesPort(self))  # every take under way, and the history's re-transcriptions
        self._model_label = ""
        self._preview_text = ""
        self._cpu_fallback = False
        self._keys = HotkeyInput(self._clock, self, hold=getattr(services.output_worker, "hold", None))
        self._output_description = "text output: not configured yet"
        self._sounds: Any = None
        self._threads: list[Any] = []
        self.left_running: list[Any] = []  # threads quitting did not wait for (the busy engine): main.run
        self._log_bridge: Any = None
        self._started = False
        self._held_notes: list[tuple[str, str]] | None = None  # notes before the windows exist (start_input)
        self._clock_warned = False
        self._history_worker = services.history_worker or HistoryWorker.for_history(
            services.history, self._settings.general.history_size
        )
        self.personaliser = Personaliser(self, **services.personalise)  # trains on its own thread

        self._reply_timer = QTimer(self)  # answers `start` requests whose microphone is slow
        self._reply_timer.setSingleShot(True)
        self._reply_timer.timeout.connect(self._start_replies_overdue)
        self._idle_timer = QTimer(self)
        self._idle_timer.setSingleShot(True)
        self._idle_timer.timeout.connect(self._idle_unload)
        self._poll = QTimer(self)
        self._poll.setInterval(RECORDER_POLL_MS)
        self._poll.timeout.connect(self._poll_recorder)
        self._keys.event.connect(self._on_hotkey)
        self._keys.problem.connect(self._notify)

    # ---- start / stop -------------------------------------------------------------------------

    def start_input(self) -> None:
        """What a press needs, before anything slow (the windows, the model): the history and audio
        threads, the microphone opened ahead of time, the hotkeys listening. A press from now on is
        honoured from its time (the microphone's pre-roll ring reaches back to it) even though it is
        handled only once the event loop runs. Notifications wait for `start` (the tray shows them)."""
        if self._started:
            return
        s = self._s
        self._started = True
        self._held_notes = []
        self._wire_workers()
        self._history_thread = start_thread(self._history_worker, "history")
        self._history_open.emit()  # first: replay what was kept aside, find interrupted takes
        self._threads = [start_thread(s.audio_worker, "audio")]
        self._audio_configure.emit(recorder_config(self._settings))
        self._start_hotkeys()

    def wait_input_ready(self, timeout: float) -> bool:
        """Block until the microphone was opened (or failed to open) and has heard a pre-roll's
        worth, so the first press gets its pre-roll too, and the hotkeys listen; at most ``timeout``
        seconds. False if that was not reached in time."""
        audio = self._s.audio_worker
        deadline = time.monotonic() + timeout
        ready = audio.wait_configured(timeout)
        ready = self._keys.wait_ready(max(0.0, deadline - time.monotonic())) and ready
        while (heard := audio.heard_s()) is not None and heard < audio.pre_roll_s():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return ready

    def start(self) -> None:
        """Everything else: the engine, output and download threads, the sounds, the model's load
        (after `start_input`, which it runs first if it has not run)."""
        s = self._s
        self.start_input()
        self._threads += [
            start_thread(s.engine_worker, "engine"),
            start_thread(s.output_worker, "output"),
            start_thread(s.download_worker, "download"),
        ]
        held, self._held_notes = self._held_notes or [], None
        for level, message in held:
            self.notified.emit(level, message)
        self._sounds = self._make_sounds(self._settings)
        if getattr(s.output_worker, "own_window", False) is None:
            from dictation.app.focus import OwnFocus

            s.output_worker.own_window = OwnFocus(self)  # nothing is pasted into our own windows
        self._output_configure.emit(output_options(self._settings))
        if self._settings.engine.model:
            self._request_load()
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
        for take_id in self.takes.start_replies():
            self._answer_start(take_id, {"ok": False, "message": "dictation is quitting"})
        self._reply_timer.stop()
        self._keys.stop()
        self._s.engine_worker.interrupt_all()  # a running live preview ends now
        self._poll.stop()
        self._idle_timer.stop()
        close_sounds = getattr(self._sounds, "close", None)
        if close_sounds is not None:
            close_sounds()
        self._s.download_worker.cancel()
        self._output_flush.emit()
        self._audio_close.emit()
        self.left_running, self._threads = stop_threads(self._threads, self._s.engine_worker), []
        # The workers have stopped; results they queued for us (a delivery's outcome, a finished
        # transcript) are handled now, and what that asks of the history worker is done before
        # it stops: it drains its queue, answers, then closes its connection.
        QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)
        self._history_drain.emit()
        QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)
        self._history_close.emit()
        stop_thread(self._history_thread)
        QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)

    def _wire_workers(self) -> None:
        s = self._s
        e, a, o, d = s.engine_worker, s.audio_worker, s.output_worker, s.download_worker
        self._build_and_load.connect(e.build_and_load)
        self._unload.connect(e.unload)
        self._transcribe.connect(e.transcribe)
        e.loading.connect(self._on_loading)  # methods, not lambdas: a lambda kept the controller alive
        e.loaded.connect(self._on_loaded)
        e.load_failed.connect(self._on_load_failed)
        e.adapters_failed.connect(self._on_adapters_failed)
        e.adapters_skipped.connect(self._on_adapters_skipped)
        e.kept_previous.connect(self._on_kept_previous)
        e.moved_to_cpu.connect(self._on_moved_to_cpu)
        e.unloaded.connect(self._on_unloaded)
        e.transcribed.connect(self._on_transcribed)
        e.transcribe_failed.connect(self._on_transcribe_failed)
        e.no_speech.connect(self._on_no_speech)
        self._begin_take.connect(e.begin_take)
        self._warm_up.connect(e.warm_up)
        self._transcribe_take.connect(e.transcribe_take)
        self._drop_take.connect(e.cancel_take)
        e.preview_ready.connect(self._on_preview)
        a.chunk_ready.connect(e.feed)  # audio thread -> engine thread directly, in order
        a.saved.connect(e.take_saved)  # likewise: the saved take, before the GUI thread hears of it
        self._audio_configure.connect(a.configure)
        self._audio_start.connect(a.start)
        self._audio_stop.connect(a.stop)
        self._audio_cancel.connect(a.cancel)
        self._audio_close.connect(a.close)
        a.started.connect(self._on_started)
        a.start_failed.connect(self._on_start_failed)
        a.saved.connect(self._on_saved)
        a.open_failed.connect(self._on_open_failed)
        self._output_configure.connect(o.configure)
        self._type_text.connect(o.type_text)
        self._output_flush.connect(o.flush)
        o.delivered.connect(self._on_delivered)
        o.described.connect(self._on_output_described)
        self._download.connect(d.run)
        d.progress.connect(self.download_progress)
        d.finished.connect(self._on_download_finished)
        h = self._history_worker
        self._history_open.connect(h.open)
        self._history_begin.connect(h.begin_take)
        self._history_store.connect(h.store_text)
        self._history_finish.connect(h.finish_take)
        self._history_discard.connect(h.discard_take)
        self._history_update.connect(h.update_entry)
        self._history_delete.connect(h.delete_entry)
        self._history_correct.connect(h.correct_entry)
        self._history_size.connect(h.set_max_entries)
        self._history_drain.connect(h.drain, Qt.ConnectionType.BlockingQueuedConnection)
        self._history_close.connect(h.close, Qt.ConnectionType.BlockingQueuedConnection)
        h.ready.connect(self._on_history_ready)
        h.stored.connect(self._on_stored)
        h.changed.connect(self.history_changed)
        h.recovered.connect(self._on_recovered)
        h.problem.connect(self._notify)
        h.corrected.connect(self.corrected)

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
        return self._model_label

    @property
    def hotkeys_paused(self) -> bool:
        return self._keys.paused

    @property
    def preview_text(self) -> str:
        """The latest live preview of the take being recorded (or just released); "" when none."""
        return self._preview_text

    def attach_log(self, bridge: Any) -> None:
        self._log_bridge = bridge
        bridge.attach(self.log_record, lambda problem: self._notify("warning", problem))

    def recent_log(self) -> list[logging.LogRecord]:
        return list(self._log_bridge.records) if self._log_bridge is not None else []

    def toggle(self) -> None:
        self._dispatch(S.ToggleRequested(self._clock()))

    def cancel_dictation(self) -> None:
        self._dispatch(S.CancelRequested())

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
        from dictation.audio.capture import meter_fraction

        return meter_fraction(self._s.audio_worker.level())

    def input_devices(self) -> list[Any]:
        from dictation.audio.devices import AudioDeviceError, list_input_devices

        try:
            return list_input_devices()
        except AudioDeviceError as exc:
            log.warning("cannot list microphones: %s", exc)
            return []

    def hotkey_description(self) -> str:
        return self._keys.describe()

    def output_description(self) -> str:
        return self._output_description

    def set_hotkeys_paused(self, paused: bool) -> None:
        if paused == self._keys.paused:
            return
        self._keys.paused = paused
        self._keys.update(recording=self._status is S.Status.RECORDING)
        log.info("global hotkeys %s", "paused" if paused else "resumed")
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
        QTimer.singleShot(400, lambda: self._type_text.emit(Retype(entry_id), entry.text))

    def delete_entry(self, entry_id: int) -> None:
        self._history_delete.emit(entry_id)  # history_changed follows once it is done

    def correct_entry(self, entry_id: int, text: str) -> None:
        """Replace an entry's text with the user's and mark it corrected; `corrected` tells how it went."""
        self._history_correct.emit(entry_id, text)  # history_changed follows once it is saved

    def retranscribe_entry(self, entry_id: int) -> None:
        """Transcribe a history entry's recording again; `retranscribed` tells how it went."""
        self.takes.retranscribe(entry_id)

    def start_download(self, repo_id: str) -> None:
        self._download.emit(repo_id)

    def cancel_download(self) -> None:
        self._s.download_worker.cancel()

    # ---- settings -----------------------------------------------------------------------------

    def _apply(self, old: Settings, new: Settings) -> None:
        if session_settings(old) != session_settings(new):
            self._dispatch(S.SettingsChanged(session_settings(new)))
        if self._started:
            if recorder_config(old) != recorder_config(new):
                self._audio_configure.emit(recorder_config(new))
            if old.output != new.output:
                self._output_configure.emit(output_options(new))
            if old.hotkeys != new.hotkeys:
                self._keys.stop()
                self._start_hotkeys()
            if old.recording != new.recording:
                self._update_sounds(new)
            if engine_key(old) != engine_key(new):
                self._cpu_fallback = False
                if new.engine.model:
                    self._request_load()
                else:
                    self._unload.emit()
        if old.general.history_size != new.general.history_size:
            self._history_size.emit(new.general.history_size)
        if old.general.start_at_login != new.general.start_at_login:
            self._set_autostart(new.general.start_at_login)
        self._restart_idle_timer()

    def _set_autostart(self, enabled: bool) -> None:
        from dictation import autostart

        try:
            path = autostart.set_enabled(enabled)
        except OSError as exc:
            self._notify("error", f"Could not change start at login: {exc}")
            return
        log.info("start at login %s (%s)", "enabled" if enabled else "disabled", path)

    def _update_sounds(self, settings: Settings) -> None:
        r = settings.recording
        if hasattr(self._sounds, "volume") and hasattr(self._sounds, "enabled"):
            self._sounds.volume, self._sounds.enabled = r.sound_volume, r.sounds
        else:
            self._sounds = self._make_sounds(settings)

    def _make_sounds(self, settings: Settings) -> Any:
        if self._s.sound_factory is not None:
            player = self._s.sound_factory(settings)
        else:
            from dictation.audio.sounds import SoundPlayer

            player = SoundPlayer(volume=settings.recording.sound_volume, enabled=settings.recording.sounds)
        if hasattr(player, "on_cue"):  # a cue the microphone hears is muted in the take (audio.cue_echo)
            player.on_cue = self._s.audio_worker.mark_cue
        return player

    def _restart_idle_timer(self) -> None:
        minutes = self._settings.engine.idle_unload_minutes
        if minutes > 0 and self._status is S.Status.IDLE and self.session.model_state is S.ModelState.READY:
            self._idle_timer.start(minutes * MINUTE_MS)
        else:
            self._idle_timer.stop()

    def _idle_unload(self) -> None:
        if self._status is S.Status.IDLE and self.session.model_state is S.ModelState.READY:
            self._unload.emit()

    # ---- hotkeys ------------------------------------------------------------------------------

    def _start_hotkeys(self) -> None:
        chooser = self._s.hotkey_chooser or _default_hotkey_chooser
        self._keys.start(self._settings.hotkeys, chooser, recording=self._status is S.Status.RECORDING)

    def _on_hotkey(self, name: str, pressed: bool, t: float) -> None:
        if name == DICTATE:
            self._dispatch(S.HotkeyDown(t) if pressed else S.HotkeyUp(t))
        elif name == CANCEL and pressed:
            self._dispatch(S.CancelRequested())

    # ---- the session ----------------------------------------------------------------------------

    def _dispatch(self, event: Any) -> None:
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
            self._set_preview("")
            if take.streaming:
                language, context = self.takes.language_context()
                self._begin_take.emit(take.id, language, context, self._settings.general.live_preview)
            self._audio_start.emit(take.id, self._event_t, take.streaming)
            self._poll.start()
        elif isinstance(action, S.StopCapture):
            self._s.engine_worker.interrupt(action.take_id)  # a running preview must not delay the text
            self._audio_stop.emit(action.take_id, self._event_t, self._settings.recording.trim_silence)
        elif isinstance(action, S.DiscardCapture):
            self._s.engine_worker.interrupt(action.take_id)
            self._set_preview("")
            self._audio_cancel.emit(action.take_id)  # deletes the take's file
            self._answer_start(action.take_id, {"message": DISCARDED_MESSAGE})  # a start not answered yet
            self.takes.discard(action.take_id)
        elif isinstance(action, S.LoadModel):
            if self._settings.engine.model:
                self._build_and_load.emit(functools.partial(engine_options, self._settings))
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
            if self._sounds is not None:
                self._sounds.play(action.kind.value)
        elif isinstance(action, S.Notify):
            self._notify(action.level.value, action.message)
        elif isinstance(action, S.ShowModelChoice):
            self.show_settings_requested.emit("model")
        elif isinstance(action, S.SetStatus):
            self._status = action.status
            self._keys.update(recording=action.status is S.Status.RECORDING)
            if action.status is not S.Status.RECORDING:
                self._poll.stop()
                self.input_level_changed.emit(0.0)
            if action.status in (S.Status.IDLE, S.Status.ERROR):
                self._set_preview("")
            self._restart_idle_timer()
            self.status_changed.emit(action.status)

    def _notify(self, level: str, message: str, *, log_as: str | None = None) -> None:
        """Show ``message`` (the tray) and log it, or log ``log_as`` instead where the message
        quotes what the user said: no dictated word goes into the log."""
        {"info": log.info, "warning": log.warning}.get(level, log.error)("%s", message if log_as is None else log_as)
        if self._held_notes is not None:  # between start_input and start: no tray to show it yet
            self._held_notes.append((level, message))
            return
        self.notified.emit(level, message)

    def _poll_recorder(self) -> None:
        """While recording: the level for the overlay, and a lost device or a full buffer."""
        audio = self._s.audio_worker
        self.input_level_changed.emit(self.input_level())
        take_id = self.session.recording_take_id
        if take_id is None:
            return
        error = audio.recorder_error()
        if error:
            self._dispatch(S.RecordingLost(take_id, error, partial_audio_available=True))
        elif audio.limit_reached():
            self._dispatch(S.MaxLengthReached(take_id))

    # ---- takes: the workers' answers, handed to `self.takes` on the GUI thread ----------------------

    def _on_started(self, take_id: int, path: Any, gap: float | None = None) -> None:
        """The mic is live and the take is being written to ``path``: its history entry comes next.
        ``gap``: the take's first sample minus the press (the take's `start_gap_s`, as far as known
        now); above `LATE_START_S` words after the press are missing, and the user is told."""
        wanted = self.takes.started(take_id, path)  # not if it was discarded before it even started
        extra: dict = {}
        if gap is not None and gap > LATE_START_S and wanted:
            warning = late_start_message(gap, self._settings.recording.keep_mic_open)
            extra = {"late_ms": round(gap * 1000), "warning": warning}
            if self._settings.recording.keep_mic_open:
                self._notify("warning", warning)
            else:  # the user chose a microphone that opens at each press; the settings say what it costs
                log.info("take %d: %s", take_id, warning)
        self._answer_start(take_id, extra)
        self._dispatch(S.RecordingStarted(take_id))

    def _on_start_failed(self, take_id: int, message: str) -> None:
        self._answer_start(take_id, {"ok": False, "message": f"Could not start recording: {message}"})
        self.takes.discard(take_id)
        self._dispatch(S.RecordingFailed(take_id, message))

    def _tick(self) -> None:
        self._dispatch(S.Tick(self._clock()))

    def _on_open_failed(self, message: str) -> None:
        self._notify("warning", f"Microphone: {message}")

    def _on_history_ready(self, take_id: int, durable: bool) -> None:
        self.takes.entry_ready(take_id)

    def _on_preview(self, take_id: int, text: str) -> None:
        if take_id == self.session.recording_take_id and self._settings.general.live_preview:
            self._set_preview(text)

    def _set_preview(self, text: str) -> None:
        if text != self._preview_text:
            self._preview_text = text
            self.preview_changed.emit(text)

    def _on_saved(self, take_id: int, saved: SavedTake) -> None:
        self.takes.saved(take_id, saved)

    def _on_no_speech(self, take_id: int) -> None:
        self.takes.no_speech(take_id)

    def _on_transcribed(self, key: int | Retranscription, transcript: Any) -> None:
        self.takes.transcribed(key, transcript)

    def _on_transcribe_failed(self, key: int | Retranscription, message: str) -> None:
        self.takes.transcribe_failed(key, message)

    def _on_stored(self, take_id: int, durable: bool) -> None:
        self.takes.stored(take_id)

    def _on_delivered(self, key: int | Retype, result: Any) -> None:
        self.takes.delivered(key, result)

    def _on_recovered(self, takes: list[Any]) -> None:
        self.takes.recovered(takes)

    def _on_output_described(self, text: str) -> None:
        self._output_description = text

    def _on_download_finished(self, repo_id: str, folder: str, error: str) -> None:
        self.download_finished.emit(repo_id, error)
        if error == "cancelled":
            self._notify("info", f"Download of {repo_id} cancelled; it resumes where it stopped next time.")
        elif error:
            self._notify("error", f"Download of {repo_id} failed: {error}")
        else:
            self._notify("info", f"Downloaded {repo_id}.")


# The desktop-file id the portal knows the app by: the file `dictation install-desktop` writes
# (dictation.desktop) and the name main.py gives Qt (setDesktopFileName), so all three agree.
APP_ID = "dictation"


def _default_hotkey_chooser(preference: str) -> Any:
    from dictation.hotkeys import choose_backend
    from dictation.hotkeys.choose import default_factories
    from dictation.hotkeys.portal import PortalBackend

    factories = {**default_factories(), "portal": lambda: PortalBackend(app_id=APP_ID)}
    return choose_backend(preference, factories=factories)
