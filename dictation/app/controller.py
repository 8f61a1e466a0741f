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
from dictation.app.history_worker import HistoryWorker
from dictation.app.options import (
    adapters_skipped_message,
    engine_key,
    engine_options,
    late_start_message,
    output_options,
    session_settings,
    without_adapters,
)
from dictation.app.workers import (
    AudioWorker,
    DownloadWorker,
    EngineWorker,
    OutputWorker,
    RecorderConfig,
    start_thread,
    stop_thread,
)
from dictation.config import History, Settings
from dictation.config.history import IN_MEMORY
from dictation.config.schema import FieldError, validate
from dictation.config.store import SettingsStore
from dictation.takes import LATE_START_S, Retranscription, Retype, SavedTake, Takes

log = logging.getLogger(__name__)

DICTATE = "dictate"
CANCEL = "cancel"
NO_MODEL_MESSAGE = "No speech model is chosen yet: open Settings → Model to download one or choose a folder."
RECORDER_POLL_MS = 100
# A command's send time (`dictation.ipc`) is the press time when it is plausible on this app's clock:
# not ahead of it (beyond a little slack) and not older than this.
MAX_COMMAND_AGE_S = 30.0
CLOCK_SLACK_S = 0.05
DISCARDED_MESSAGE = "the recording was discarded (cancelled, or stopped too soon)"
START_REPLY_MS = 2000  # a `start` whose microphone is not recording by then is answered all the same
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


def _history_worker_for(history: History, max_entries: int) -> HistoryWorker:
    """A worker writing to ``history``'s file on its own connection; where the history lives in
    memory (its file could not be opened), the worker writes into that same in-memory history, its
    journal goes to the data folder (never the working directory), and no recording is pruned."""
    if str(history.path) != IN_MEMORY:
        return HistoryWorker(history.path, max_entries=max_entries)
    from dictation import paths
    from dictation.config.journal import FILE_NAME

    return HistoryWorker(
        history.path, max_entries=max_entries, journal_path=paths.data_dir() / FILE_NAME, opener=lambda: history
    )


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

    # queued calls into the worker threads
    _load = Signal(object)
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
    _deliver = Signal(object, str)  # take id or Retype, text
    _output_flush = Signal()
    _download = Signal(str)
    _history_open = Signal()
    _history_begin = Signal(int, object)  # take id, path of the take's file (or None)
    _history_store = Signal(int, object)  # take id, fields (text first: before it is typed)
    _history_finish = Signal(int, object, bool, int)  # take id, fields, delete the audio, recordings kept
    _history_discard = Signal(int, bool, int)  # take id, delete the audio, recordings kept
    _history_update = Signal(int, object)  # entry id, fields
    _history_delete = Signal(int)
    _history_size = Signal(int)
    _history_drain = Signal()  # blocking: returns once the history worker did everything queued
    _history_close = Signal()  # blocking
    # from the hotkey thread
    _hotkey_event = Signal(str, bool, float)
    _hotkey_error = Signal(str, bool)

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
        self.takes = Takes(_TakesPort(self))  # every take under way, and the history's re-transcriptions
        self._model_label = ""
        self._preview_text = ""
        self._cpu_fallback = False
        self._hotkeys: Any = None
        self._hotkey_choice: Any = None
        self._hotkeys_paused = False
        self._output_description = "text output: not configured yet"
        self._sounds: Any = None
        self._threads: list[Any] = []
        self._log_bridge: Any = None
        self._started = False
        self._held_notes: list[tuple[str, str]] | None = None  # notes before the windows exist (start_input)
        # take id -> its `start` request's answer, and when to answer it at the latest (monotonic s)
        self._start_replies: dict[int, tuple[Callable[[dict], None], float]] = {}
        self._clock_warned = False
        self._history_worker = services.history_worker or _history_worker_for(
            services.history, self._settings.general.history_size
        )

        self._reply_timer = QTimer(self)  # answers `start` requests whose microphone is slow
        self._reply_timer.setSingleShot(True)
        self._reply_timer.timeout.connect(self._start_replies_overdue)
        self._idle_timer = QTimer(self)
        self._idle_timer.setSingleShot(True)
        self._idle_timer.timeout.connect(self._idle_unload)
        self._poll = QTimer(self)
        self._poll.setInterval(RECORDER_POLL_MS)
        self._poll.timeout.connect(self._poll_recorder)
        self._hotkey_event.connect(self._on_hotkey)
        self._hotkey_error.connect(self._on_hotkey_error)

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
        if self._hotkeys is not None:
            ready = self._hotkeys.wait_ready(max(0.0, deadline - time.monotonic())) and ready
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
        for job_id in list(self._start_replies):
            self._answer_start(job_id, {"ok": False, "message": "dictation is quitting"})
        self._reply_timer.stop()
        self._stop_hotkeys()
        self._s.engine_worker.interrupt_all()  # a running live preview ends now
        self._poll.stop()
        self._idle_timer.stop()
        close_sounds = getattr(self._sounds, "close", None)
        if close_sounds is not None:
            close_sounds()
        self._s.download_worker.cancel()
        self._output_flush.emit()
        self._audio_close.emit()
        for thread in self._threads:
            stop_thread(thread)
        self._threads = []
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
        self._load.connect(e.load)
        self._unload.connect(e.unload)
        self._transcribe.connect(e.transcribe)
        e.loading.connect(lambda what: self.model_progress.emit(f"Loading {what} …"))
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
        a.open_failed.connect(lambda msg: self._notify("warning", f"Microphone: {msg}"))
        self._output_configure.connect(o.configure)
        self._deliver.connect(o.deliver)
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
        self._history_size.connect(h.set_max_entries)
        self._history_drain.connect(h.drain, Qt.ConnectionType.BlockingQueuedConnection)
        self._history_close.connect(h.close, Qt.ConnectionType.BlockingQueuedConnection)
        h.ready.connect(self._on_history_ready)
        h.stored.connect(self._on_stored)
        h.changed.connect(self.history_changed)
        h.recovered.connect(self._on_recovered)
        h.problem.connect(self._notify)

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
        return self._hotkeys_paused

    @property
    def preview_text(self) -> str:
        """The latest live preview of the take being recorded (or just released); "" when none."""
        return self._preview_text

    def attach_log(self, bridge: Any) -> None:
        self._log_bridge = bridge
        bridge.record.connect(self.log_record)

    def recent_log(self) -> list[logging.LogRecord]:
        return list(self._log_bridge.records) if self._log_bridge is not None else []

    def toggle(self) -> None:
        self._dispatch(S.ToggleRequested(self._clock()))

    def start_dictation(self) -> None:
        self._dispatch(S.StartRequested(self._clock()))

    def stop_dictation(self) -> None:
        self._dispatch(S.StopRequested(self._clock()))

    def cancel_dictation(self) -> None:
        self._dispatch(S.CancelRequested())

    def handle_ipc(
        self, command: str, sent: float | None = None, answer: Callable[[dict], None] | None = None
    ) -> dict | None:
        """Answer one `dictation <command>` (see dictation.ipc). ``sent`` is the client's monotonic
        send time: a plausible one is the press time (`command_time`). With ``answer``, a command
        that starts a recording returns None and is answered through it once the microphone records
        (`_answer_start`): late (``late_ms``, ``warning``) or failed (``ok`` false) starts are told."""
        t = self.command_time(sent)
        actions = {  # (not through toggle() etc.: those are slots, and Qt passes them arguments of its own)
            "toggle": lambda: self._dispatch(S.ToggleRequested(t)),
            "start": lambda: self._dispatch(S.StartRequested(t)),
            "stop": lambda: self._dispatch(S.StopRequested(t)),
            "cancel": self.cancel_dictation,
            "status": lambda: None,
            "show-settings": lambda: self.show_settings_requested.emit(""),
            "show-history": self.show_history_requested.emit,
            "quit": self.quit_requested.emit,
        }
        if command not in actions:
            return {"ok": False, "message": f"unknown command {command!r}; known: {', '.join(actions)}"}
        before = self.session.recording_job_id
        actions[command]()
        if command in ("toggle", "start") and self.session.model_state is S.ModelState.NOT_CHOSEN:
            return {"ok": False, "message": S.NO_MODEL_MESSAGE}  # refused: the command says so too
        job_id = self.session.recording_job_id
        if answer is not None and job_id is not None and job_id != before and job_id in self.takes:
            self._start_replies[job_id] = (answer, time.monotonic() + START_REPLY_MS / 1000)
            if not self._reply_timer.isActive():
                self._reply_timer.start(START_REPLY_MS)
            return None
        return self._status_reply()

    def command_time(self, sent: float | None) -> float:
        """The time a command was sent, on this app's clock, where plausible; else now."""
        now = self._clock()
        if sent is None:
            return now
        if sent <= now + CLOCK_SLACK_S and now - sent <= MAX_COMMAND_AGE_S:
            return min(sent, now)
        if not self._clock_warned:  # another clock (a container's time namespace, another machine)
            self._clock_warned = True
            log.warning("a command's send time is %.1f s off this app's clock; using the time it arrived", now - sent)
        return now

    def _status_reply(self) -> dict:
        return {
            "ok": True,
            "status": self._status.value,
            "model": self._model_label,
            "model_state": self.session.model_state.value,
            "hotkeys": self._hotkey_choice.name if self._hotkey_choice is not None else "none",
            "hotkeys_paused": self._hotkeys_paused,
            "hotkey_problems": list(getattr(self._hotkeys, "problems", [])),
        }

    def _answer_start(self, job_id: int, extra: dict | None = None) -> None:
        """Answer the `start` (or `toggle`) request that began take ``job_id``, if one waits."""
        pending = self._start_replies.pop(job_id, None)
        if pending is not None:
            pending[0]({**self._status_reply(), **(extra or {})})

    def _start_replies_overdue(self) -> None:
        now = time.monotonic()
        warning = (
            f"The microphone was not recording {START_REPLY_MS / 1000:g} s after the press (it is slow to "
            "open): what is said until it records is missing."
        )
        for job_id, (_, due) in list(self._start_replies.items()):
            if due <= now:
                self._answer_start(job_id, {"warning": warning})
        if self._start_replies:
            due = min(due for _, due in self._start_replies.values())
            self._reply_timer.start(max(1, round((due - now) * 1000)))

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
        if self._hotkey_choice is None:
            return "Hotkeys: not started."
        return self._hotkey_choice.describe()

    def output_description(self) -> str:
        return self._output_description

    def set_hotkeys_paused(self, paused: bool) -> None:
        if paused == self._hotkeys_paused:
            return
        self._hotkeys_paused = paused
        self._update_enabled_hotkeys()
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
        QTimer.singleShot(400, lambda: self._deliver.emit(Retype(entry_id), entry.text))

    def delete_entry(self, entry_id: int) -> None:
        self._history_delete.emit(entry_id)  # history_changed follows once it is done

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
                self._stop_hotkeys()
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

    # ---- model --------------------------------------------------------------------------------

    def _request_load(self, device: str | None = None) -> None:
        if self.session.model_state is not S.ModelState.LOADING:
            self._dispatch(S.ModelLoading())
        self._load.emit(functools.partial(engine_options, self._settings, device))

    def _on_loaded(self, label: str, seconds: float) -> None:
        self._model_label = label
        self.model_label_changed.emit(label)
        self.model_progress.emit(f"Loaded {label} in {seconds:.1f} s")
        log.info("speech model ready: %s (%.1f s)", label, seconds)
        self._dispatch(S.ModelReady())
        if self._status is S.Status.IDLE:
            # Not when a press started the load: that take is recorded or waiting to be transcribed,
            # and must not queue behind the warm-up's own pass.
            self._warm_up.emit()
        self.takes.transcribe_recovered()

    def _on_load_failed(self, message: str, gpu_failure: bool) -> None:
        self._model_label = ""
        self.model_label_changed.emit("")
        if gpu_failure and not self._cpu_fallback and self._settings.engine.device != "cpu":
            self._cpu_fallback = True
            self._notify(
                "warning",
                f"The GPU could not be used ({message}). Loading the model on the CPU instead; "
                "dictation will be slower.",
            )
            self.model_progress.emit(f"GPU failed: {message}; loading on the CPU …")
            self._load.emit(functools.partial(engine_options, self._settings, device="cpu"))
            return
        self.model_progress.emit(f"Failed: {message}")
        self._dispatch(S.ModelFailed(message))

    def _on_kept_previous(self, message: str, label: str) -> None:
        self._notify("error", f"The new speech model could not be loaded: {message}. Still using {label}.")
        self._on_loaded(label, 0.0)

    def _on_moved_to_cpu(self, message: str, label: str) -> None:
        self._cpu_fallback = True
        self._notify(
            "warning",
            f"The GPU failed during a dictation ({message}). The model now runs on the CPU, so dictation "
            "is slower until the model is next loaded (a restart or a model setting change); "
            "this dictation's text is not lost.",
        )
        self._model_label = label
        self.model_label_changed.emit(label)

    def _on_adapters_failed(self, message: str) -> None:
        self._notify("warning", f"LoRA adapters not applied: {message}. The model keeps the adapters it had.")

    def _on_adapters_skipped(self, skipped: list[tuple[str, str]]) -> None:
        """The model loaded without these adapters (missing, for another model, unusable): switch them
        off in the settings, saved, so the next start does not try them again, and say so."""
        old = self._settings
        new = without_adapters(old, skipped)
        saved = True
        if new != old:
            try:
                self._s.store.save(new)
            except (OSError, ValueError) as exc:  # SettingsError is a ValueError
                log.warning("cannot save the settings with the adapter switched off: %s", exc)
                saved = False
            # The engine already runs without them: no reload (hence not through apply_settings).
            self._settings = new
            self.settings_changed.emit(new)
        self._notify("warning", adapters_skipped_message(skipped, saved))

    def _on_unloaded(self) -> None:
        self._model_label = ""
        self.model_label_changed.emit("")
        if self._settings.engine.model and self.session.model_state is S.ModelState.READY:
            log.info("speech model unloaded after %d idle minutes", self._settings.engine.idle_unload_minutes)
            self.model_progress.emit("Unloaded (idle); it loads again at the next dictation.")
            self._dispatch(S.ModelUnloaded())
        elif not self._settings.engine.model:
            self.model_progress.emit(NO_MODEL_MESSAGE)
            self._dispatch(S.ModelNotChosen())

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
        from dictation.hotkeys import HotkeyError

        h = self._settings.hotkeys
        try:
            choice = (self._s.hotkey_chooser or _default_hotkey_chooser)(h.backend)
        except HotkeyError as exc:
            self._notify("error", f"Global hotkeys are off: {exc}")
            return
        self._hotkey_choice = choice
        log.info("%s", choice.describe())
        if choice.backend is None:
            self._notify("warning", choice.describe().splitlines()[0])
            return
        bindings = {DICTATE: h.hotkey}
        if h.cancel_key and choice.backend.name != "portal":
            # The portal would take Esc from every application all the time, so there the cancel key is
            # left out. Elsewhere it is enabled only while recording (`_update_enabled_hotkeys`): the x11 backend
            # grabs it only then, so Esc keeps working in the user's windows.
            bindings[CANCEL] = h.cancel_key
        backend = choice.backend
        recording = self._status is S.Status.RECORDING
        disabled = set(bindings) if self._hotkeys_paused else set() if recording else {CANCEL}
        try:
            backend.start(
                bindings,
                self._from_hotkey_thread,
                lambda error: self._hotkey_error.emit(str(error), bool(getattr(error, "fatal", False))),
                disabled=disabled,
            )
        except (HotkeyError, OSError) as exc:
            self._notify("error", f"Global hotkeys could not start ({backend.name}): {exc}")
            return
        self._hotkeys = backend

    def _update_enabled_hotkeys(self) -> None:
        """Paused hotkeys are off, and the cancel key is on only while recording: the x11 backend
        grabs a key only while it is on, so otherwise it reaches the user's windows (and the hotkey
        field of the settings window while a new hotkey is being chosen)."""
        backend = self._hotkeys
        if backend is None:
            return
        recording = self._status is S.Status.RECORDING
        for name in backend.bindings:
            backend.set_enabled(name, not self._hotkeys_paused and (name != CANCEL or recording))

    def _stop_hotkeys(self) -> None:
        if self._hotkeys is not None:
            self._hotkeys.stop()
            self._hotkeys = None

    def _from_hotkey_thread(self, name: str, pressed: bool) -> None:
        """Runs on the listener's thread: stamp the time now (the pre-roll counts from it), hand over."""
        if not self._hotkeys_paused:  # paused (e.g. while a hotkey is being captured): keys are not events
            self._hotkey_event.emit(name, pressed, self._clock())

    def _on_hotkey(self, name: str, pressed: bool, t: float) -> None:
        if name == DICTATE:
            self._dispatch(S.HotkeyDown(t) if pressed else S.HotkeyUp(t))
        elif name == CANCEL and pressed:
            self._dispatch(S.CancelRequested())

    def _on_hotkey_error(self, message: str, fatal: bool) -> None:
        self._notify("error" if fatal else "warning", f"Hotkeys: {message}")

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
            take = self.takes.begin(action.job_id)
            self._set_preview("")
            if take.streaming:
                language, context = self.takes.language_context()
                self._begin_take.emit(take.id, language, context, self._settings.general.live_preview)
            self._audio_start.emit(take.id, self._event_t, take.streaming)
            self._poll.start()
        elif isinstance(action, S.StopCapture):
            self._s.engine_worker.interrupt(action.job_id)  # a running preview must not delay the text
            self._audio_stop.emit(action.job_id, self._event_t, self._settings.recording.trim_silence)
        elif isinstance(action, S.DiscardCapture):
            self._s.engine_worker.interrupt(action.job_id)
            self._set_preview("")
            self._audio_cancel.emit(action.job_id)  # deletes the take's file
            self._answer_start(action.job_id, {"message": DISCARDED_MESSAGE})  # a start not answered yet
            self.takes.discard(action.job_id)
        elif isinstance(action, S.LoadModel):
            if self._settings.engine.model:
                self._load.emit(functools.partial(engine_options, self._settings))
            else:
                self._queue.append(S.ModelNotChosen())
        elif isinstance(action, S.Transcribe):
            self.takes.want_transcription(action.job_id)
        elif isinstance(action, S.SkipTranscription):
            self.takes.skip(action.job_id, action.reason)
        elif isinstance(action, S.DeliverText):
            self.takes.deliver(action)
        elif isinstance(action, S.ScheduleTick):
            delay = max(0, int((action.at_t - self._clock()) * 1000) + 1)
            QTimer.singleShot(delay, self, lambda: self._dispatch(S.Tick(self._clock())))
        elif isinstance(action, S.PlaySound):
            if self._sounds is not None:
                self._sounds.play(action.kind.value)
        elif isinstance(action, S.Notify):
            self._notify(action.level.value, action.message)
        elif isinstance(action, S.ShowModelChoice):
            self.show_settings_requested.emit("model")
        elif isinstance(action, S.SetStatus):
            self._status = action.status
            self._update_enabled_hotkeys()
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
        job_id = self.session.recording_job_id
        if job_id is None:
            return
        error = audio.recorder_error()
        if error:
            self._dispatch(S.RecordingLost(job_id, error, partial_audio_available=True))
        elif audio.limit_reached():
            self._dispatch(S.MaxLengthReached(job_id))

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
        self.takes.discard(take_id)
        self._answer_start(take_id, {"ok": False, "message": f"Could not start recording: {message}"})
        self._dispatch(S.RecordingFailed(take_id, message))

    def _on_history_ready(self, take_id: int, durable: bool) -> None:
        self.takes.entry_ready(take_id)

    def _on_preview(self, take_id: int, text: str) -> None:
        if take_id == self.session.recording_job_id and self._settings.general.live_preview:
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


class _TakesPort:
    """`dictation.takes.TakesPort` for the controller: what `Takes` asks for becomes a queued signal."""

    def __init__(self, controller: AppController) -> None:
        self._c = controller

    @property
    def settings(self) -> Settings:
        return self._c._settings

    @property
    def model_label(self) -> str:
        return self._c._model_label

    @property
    def model_ready(self) -> bool:
        return self._c.session.model_state is S.ModelState.READY

    @property
    def running(self) -> bool:
        return self._c._started

    def dispatch(self, event: Any) -> None:
        self._c._dispatch(event)

    def notify(self, level: str, message: str, *, log_as: str | None = None) -> None:
        self._c._notify(level, message, log_as=log_as)

    def transcribe_take(self, take_id: int, language: str | None, context: str) -> None:
        self._c._transcribe_take.emit(take_id, language, context)

    def drop_take(self, take_id: int) -> None:
        self._c._drop_take.emit(take_id)

    def transcribe_entry(self, request: Retranscription, samples: Any, language: str | None, context: str) -> None:
        self._c._transcribe.emit(request, samples, language, context)

    def history_entry(self, entry_id: int) -> Any:
        return self._c.history.get(entry_id)

    def history_begin(self, take_id: int, audio_path: Any) -> None:
        self._c._history_begin.emit(take_id, audio_path)

    def history_store(self, take_id: int, fields: dict) -> None:
        self._c._history_store.emit(take_id, fields)

    def history_finish(self, take_id: int, fields: dict, delete_audio: bool, keep: int) -> None:
        self._c._history_finish.emit(take_id, fields, delete_audio, keep)

    def history_discard(self, take_id: int, delete_audio: bool, keep: int) -> None:
        self._c._history_discard.emit(take_id, delete_audio, keep)

    def history_update(self, entry_id: int, fields: dict) -> None:
        self._c._history_update.emit(entry_id, fields)

    def retranscribed(self, entry_id: int, problem: str) -> None:
        self._c.retranscribed.emit(entry_id, problem)

    def deliver(self, key: int | Retype, text: str) -> None:
        self._c._deliver.emit(key, text)


# The desktop-file id the portal knows the app by: the file `dictation install-desktop` writes
# (dictation.desktop) and the name main.py gives Qt (setDesktopFileName), so all three agree.
APP_ID = "dictation"


def _default_hotkey_chooser(preference: str) -> Any:
    from dictation.hotkeys import choose_backend
    from dictation.hotkeys.choose import default_factories
    from dictation.hotkeys.portal import PortalBackend

    factories = {**default_factories(), "portal": lambda: PortalBackend(app_id=APP_ID)}
    return choose_backend(preference, factories=factories)
