"""The dictation lifecycle: one deterministic state machine that receives every event and returns actions.

`DictationSession.handle(event) -> list[Action]` is the only entry point. It does no I/O, starts no
thread or timer and never reads a clock: time arrives inside the events (`t`, monotonic seconds,
e.g. `time.monotonic()` taken when the app received the input), and where the machine needs a
timeout it returns `ScheduleTick(at_t)` and waits for the app to send `Tick(t)`. The app performs
the returned actions in list order. Everything below is the contract the tray app is wired against.

State (three independent parts, so that overlaps are explicit)
--------------------------------------------------------------
- model: `ModelState` LOADING, READY, FAILED, UNLOADED (unloaded on purpose, e.g. idle unload) or
  NOT_CHOSEN (no model is set: a new user who has not downloaded or picked one yet).
- recorder: none, or one recording (its take id, start time, max-length deadline, whether the mic
  is live yet, and whether it is *held* -- stops when the hotkey is released -- or *hands-free* --
  stops on the next press / toggle / stop).
- queue: a FIFO of finished takes, in take-id order, each waiting for the model, transcribing, done
  (text) or failed. Text leaves the FIFO only from its head, so it is typed in recording order.

So "recording while loading" and "recording while transcribing" are simply a recording plus a
non-empty FIFO. `status` folds the three into one value for the tray, first match wins:
RECORDING (a recording exists: the mic is live, which matters most) > ERROR (model FAILED or NOT_CHOSEN) >
LOADING (model LOADING) > TRANSCRIBING (takes pending) > IDLE (includes UNLOADED: ready to record).
After each event whose handling changed `status`, the last action is `SetStatus(status)`.

Within one list, actions come by kind: microphone (Start/Stop/DiscardCapture: the mic first, and
the stop cue is not recorded), engine (LoadModel, Transcribe, SkipTranscription), DeliverText,
ScheduleTick, PlaySound, Notify, ShowModelChoice, SetStatus; within a kind, in take order.

Take ids
--------
A take is one recording and what follows from it: this machine keeps its lifecycle and its place in
the delivery queue, `dictation.takes` the app's side of it, under the same id. Each
`StartCapture(take_id)` takes the next id (1, 2, ...). Every started capture ends in exactly one of:
`StopCapture(id)` (the app saves the audio to disk, which is principle 7's "on disk before
transcription"; the take enters the FIFO), `DiscardCapture(id)` (the app drops the audio), or the
app's own `RecordingFailed(id, ...)`. Discarded ids are never reused, so ids have gaps. Recorder and
worker events carry the id; events for an id that is not current (late, duplicated) are ignored.
`Transcribe(id)` is always emitted after that take's `StopCapture(id)`, never before. If the app
cannot save a take's audio it still transcribes the take from memory (the text matters more than
the file); `TranscriptionFailed(id, message, audio_saved=False)` then says the audio is gone too.

Inputs and modes
----------------
- Auto-repeat: a `HotkeyDown` while the hotkey is already down (no `HotkeyUp` since) is ignored, and
  a `HotkeyUp` without a matching down is ignored. The held flag is tracked apart from the recorder,
  so repeats stay ignored after a cancel or an auto-stop while the key is still held. If a backend
  loses a release, the next physical press heals it: its down is ignored, its up clears the flag.
- A press (`HotkeyDown`) while a hands-free recording runs stops it, in every mode (the recording
  may have come from the tray or IPC). The release that follows does nothing.
- push_to_talk: press starts a held recording, release stops it.
- toggle: press starts a hands-free recording, the next press stops it; releases are ignored.
- hybrid: press starts recording at once (no audio lost while deciding). A release at least
  `hold_threshold_s` after the press stops it (push-to-talk); an earlier release (a tap) turns it
  hands-free and the next press stops it.
- Tray click / `dictation toggle` = `ToggleRequested`: stop if recording, else start hands-free.
  `StartRequested` while recording and `StopRequested` / `CancelRequested` while not recording are
  no-ops, so compositor `bind` + `bindr` pairs can drive push-to-talk over IPC. IPC ignores the mode.
- Too short: a recording stopped by the user (hotkey, toggle, stop) less than `min_press_s` after
  it started is discarded silently -- no take, no sound, no notification. It covers accidental taps
  in push-to-talk (a 0.1 s clip holds no speech) and double clicks on the tray; in hybrid a short tap
  never stops anything, it goes hands-free. Automatic stops (max length, device lost) keep the audio.
- Settings (`SettingsChanged`) apply to what happens next; a running recording keeps its deadline.

Sounds and notifications
------------------------
- `PlaySound(START)` when the app reports `RecordingStarted(id)`, i.e. when the mic is really live,
  not when capture was requested: opening a device can take hundreds of ms and words spoken before
  it is live are lost, so the cue means "speak now". STOP when a recording joins the queue, CANCEL
  for a cancel, ERROR for any failure (in place of STOP when a stop goes wrong).
- `Notify(level, message)` is for things the user did not do themselves: failures, an automatic
  stop, a dictation that waits for the model, an empty transcript. Deliberate actions get sounds only.

Decisions
---------
- Cancel discards the live recording only (`DiscardCapture`: not saved, not in history -- an
  explicit user choice overrides "nothing is lost"). It does not touch takes already stopped: their
  audio is saved and their text will be typed. Esc is a key users press in their own windows for
  many reasons, so a stray Esc must not throw away a dictation the user already finished; and the
  engine cannot interrupt a running decode anyway. With no recording, cancel is a no-op.
- A press while takes are pending starts a new recording at once; pending results are still typed
  in take order, even when transcriptions finish out of order.
- Press while loading: the recording works; at stop the take waits in the FIFO (`StopCapture`, no
  `Transcribe`) and the first waiting take gets an info `Notify` that it will be typed when the model
  is ready. `ModelReady` then emits `Transcribe` for every waiting take, in order.
- Model unloaded (`ModelUnloaded`): a new recording emits `LoadModel()` right after `StartCapture`, so
  loading overlaps the user speaking; the take waits as above.
- Model failed (`ModelFailed`): status ERROR, an error `Notify` and sound. Takes waiting for the model
  get `SkipTranscription(id, reason)`: their audio stays saved, they are not transcribed or typed.
  Recording still works while failed (the user has often spoken before noticing the tray icon):
  at stop the audio is saved (`StopCapture`), then `SkipTranscription` and a warning `Notify`. Text
  is never typed minutes later into whatever window then has focus; re-transcribing saved audio is
  a history feature. Takes already transcribing are unaffected. `ModelLoading` (a retry) shows
  LOADING; `ModelReady` clears the error and, after a failure, says so with an info `Notify`.
- Transcription failure of one take: error `Notify` + sound at once (saying whether the recording
  was saved, as the event tells); the take is then skipped in the FIFO, so later takes are typed as
  soon as they are done and at their turn.
- Empty transcript (only whitespace, e.g. silence or a muted mic): no `DeliverText`; an info `Notify`
  at the take's turn, because "nothing happened" is otherwise indistinguishable from a broken mic.
  Non-empty text is delivered unchanged (spacing between dictations is the output layer's job).
- Recording failed to start (`RecordingFailed`): error `Notify` + sound, no take. Device lost mid-way
  (`RecordingLost`): with partial audio the recording ends like a normal stop (saved, transcribed)
  plus an error sound and a warning; without audio it is discarded, with an error `Notify`.
- Max length (`max_recording_s`, None = unlimited): starting a recording schedules a `Tick` at
  its deadline; a `Tick` at or after the current recording's deadline stops it as a normal stop plus
  an info `Notify`. Stale ticks (early, or for a recording that already ended) are ignored, so timers
  never need cancelling. `MaxLengthReached(id)` (e.g. the recorder's buffer is full) stops it too.
- No model chosen (`ModelNotChosen`, or a session created NOT_CHOSEN): a press, tray toggle or IPC
  start records nothing. It answers at once with the ERROR sound, an error `Notify` (`NO_MODEL_MESSAGE`)
  and `ShowModelChoice()` (the app opens its Model page): speaking into a take that can never be
  transcribed helps nobody. Takes waiting for the model are skipped as for a failure, and a recording
  already running when the model is unset is saved and skipped at its stop. `ModelLoading` (a model was
  chosen) leaves the state; the `ModelReady` that follows says "Speech model ready.".
- Status ERROR reflects only the model (a condition the user must fix); microphone and
  transcription failures are one-off notifications, the status stays what the lifecycle says.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dictation.session_events import (
    Action,
    CancelRequested,
    DeliverText,
    DiscardCapture,
    Event,
    HotkeyDown,
    HotkeyUp,
    Level,
    LoadModel,
    MaxLengthReached,
    Mode,
    ModelFailed,
    ModelLoading,
    ModelNotChosen,
    ModelReady,
    ModelState,
    ModelUnloaded,
    Notify,
    PlaySound,
    RecordingFailed,
    RecordingLost,
    RecordingStarted,
    ScheduleTick,
    SessionSettings,
    SetStatus,
    SettingsChanged,
    ShowModelChoice,
    SkipTranscription,
    Sound,
    StartCapture,
    StartRequested,
    Status,
    StopCapture,
    StopRequested,
    Tick,
    ToggleRequested,
    Transcribe,
    TranscriptionDone,
    TranscriptionFailed,
)

__all__ = [
    "Action",
    "CancelRequested",
    "DeliverText",
    "DictationSession",
    "DiscardCapture",
    "Event",
    "HotkeyDown",
    "HotkeyUp",
    "Level",
    "LoadModel",
    "MaxLengthReached",
    "Mode",
    "ModelFailed",
    "ModelLoading",
    "ModelNotChosen",
    "ModelReady",
    "ModelState",
    "ModelUnloaded",
    "NO_MODEL_MESSAGE",
    "NO_MODEL_REASON",
    "NO_SPEECH_MESSAGE",
    "Notify",
    "PlaySound",
    "RecordingFailed",
    "RecordingLost",
    "RecordingStarted",
    "ScheduleTick",
    "SessionSettings",
    "SetStatus",
    "SettingsChanged",
    "ShowModelChoice",
    "SkipTranscription",
    "Sound",
    "StartCapture",
    "StartRequested",
    "Status",
    "StopCapture",
    "StopRequested",
    "Tick",
    "ToggleRequested",
    "Transcribe",
    "TranscriptionDone",
    "TranscriptionFailed",
    "WAITING_MESSAGE",
]

# The order of actions within one list, by kind; within a kind, the order of events (take order).
_ORDER = {
    kind: rank
    for rank, kinds in enumerate(
        [(StartCapture, StopCapture, DiscardCapture), (LoadModel, Transcribe, SkipTranscription), (DeliverText,)]
        + [(ScheduleTick,), (PlaySound,), (Notify,), (ShowModelChoice,), (SetStatus,)]
    )
    for kind in kinds
}

# ---- the machine ----

NO_SPEECH_MESSAGE = "No speech recognised; nothing was typed."
WAITING_MESSAGE = "The speech model is still loading; your dictation will be typed when it is ready."
NO_MODEL_REASON = "no speech model is chosen"
NO_MODEL_MESSAGE = (
    "No speech model is chosen yet, so nothing was recorded: download one or choose a model folder "
    "on the Model page of the settings."
)


class _TakeState(Enum):
    WAITING_FOR_MODEL = "waiting"
    TRANSCRIBING = "transcribing"
    DONE = "done"
    FAILED = "failed"


@dataclass
class _QueuedTake:
    state: _TakeState
    text: str = ""
    language: str | None = None


@dataclass
class _Recording:
    take_id: int
    started_at: float
    deadline: float | None
    hands_free: bool  # False: held, stops when the hotkey is released
    live: bool = False  # the app reported RecordingStarted


class DictationSession:
    """The lifecycle owner; see the module docstring for the full contract."""

    def __init__(
        self, settings: SessionSettings | None = None, *, model_state: ModelState = ModelState.LOADING
    ) -> None:
        self.settings = settings or SessionSettings()
        self._model = ModelState(model_state)
        self._model_error: str | None = None
        # A load failed or no model was chosen: say when the model works.
        self._announce_ready = self._model is ModelState.NOT_CHOSEN
        self._hotkey_down = False
        self._recording: _Recording | None = None
        self._queue: dict[int, _QueuedTake] = {}  # the FIFO: insertion order is take order
        self._last_take_id = 0

    # ---- read-only views ----

    @property
    def model_state(self) -> ModelState:
        return self._model

    @property
    def hotkey_down(self) -> bool:
        return self._hotkey_down

    @property
    def status(self) -> Status:
        if self._recording is not None:
            return Status.RECORDING
        if self._model in (ModelState.FAILED, ModelState.NOT_CHOSEN):
            return Status.ERROR
        if self._model is ModelState.LOADING:
            return Status.LOADING
        if self._queue:
            return Status.TRANSCRIBING
        return Status.IDLE

    @property
    def recording_take_id(self) -> int | None:
        return None if self._recording is None else self._recording.take_id

    @property
    def hands_free(self) -> bool:
        return self._recording is not None and self._recording.hands_free

    @property
    def pending_takes(self) -> tuple[int, ...]:
        """Stopped recordings whose text has not been delivered yet, in delivery order."""
        return tuple(self._queue)

    # ---- the entry point ----

    def handle(self, event: Event) -> list[Action]:
        before = self.status
        actions = sorted(self._dispatch(event), key=lambda action: _ORDER[type(action)])  # stable
        if self.status is not before:
            actions.append(SetStatus(self.status))
        return actions

    def _dispatch(self, event: Event) -> list[Action]:
        rec = self._recording
        match event:
            case HotkeyDown(t):
                if self._hotkey_down:
                    return []  # auto-repeat
                self._hotkey_down = True
                if rec is not None:
                    return self._stop_by_user(t)
                return self._start(t, hands_free=self.settings.mode is Mode.TOGGLE)
            case HotkeyUp(t):
                if not self._hotkey_down:
                    return []
                self._hotkey_down = False
                if rec is None or rec.hands_free:
                    return []
                if self.settings.mode is Mode.HYBRID and t - rec.started_at < self.settings.hold_threshold_s:
                    rec.hands_free = True
                    return []
                return self._stop_by_user(t)
            case ToggleRequested(t):
                return self._stop_by_user(t) if rec is not None else self._start(t, hands_free=True)
            case StartRequested(t):
                return [] if rec is not None else self._start(t, hands_free=True)
            case StopRequested(t):
                return [] if rec is None else self._stop_by_user(t)
            case CancelRequested():
                if rec is None:
                    return []
                self._recording = None
                return [DiscardCapture(rec.take_id), PlaySound(Sound.CANCEL)]
            case Tick(t):
                if rec is None or rec.deadline is None or t < rec.deadline:
                    return []
                return self._max_length_stop(rec)
            case MaxLengthReached(take_id):
                return self._max_length_stop(rec) if self._is_current(take_id) else []
            case RecordingStarted(take_id):
                if not self._is_current(take_id) or rec.live:
                    return []
                rec.live = True
                return [PlaySound(Sound.START)]
            case RecordingFailed(take_id, message):
                if not self._is_current(take_id):
                    return []
                self._recording = None
                return [PlaySound(Sound.ERROR), Notify(Level.ERROR, f"Could not start recording: {message}")]
            case RecordingLost(take_id, message, partial):
                if not self._is_current(take_id):
                    return []
                self._recording = None
                if partial:
                    lost = f"Microphone lost: {message}. The recording so far was kept."
                    return [*self._finish(rec, cue=Sound.ERROR), Notify(Level.WARNING, lost)]
                lost = f"Microphone lost: {message}. Nothing was recorded."
                return [DiscardCapture(rec.take_id), PlaySound(Sound.ERROR), Notify(Level.ERROR, lost)]
            case ModelLoading():
                self._model, self._model_error = ModelState.LOADING, None
                return []
            case ModelReady():
                return self._model_ready()
            case ModelFailed(message):
                return self._model_failed(message)
            case ModelUnloaded():
                self._model = ModelState.UNLOADED
                return self._ensure_loading() if self._waiting() else []
            case ModelNotChosen():
                return self._model_not_chosen()
            case TranscriptionDone(take_id, text, language):
                take = self._queue.get(take_id)
                if take is None or take.state in (_TakeState.DONE, _TakeState.FAILED):
                    return []
                take.state, take.text, take.language = _TakeState.DONE, text, language
                return self._flush()
            case TranscriptionFailed(take_id, message, audio_saved):
                take = self._queue.get(take_id)
                if take is None or take.state in (_TakeState.DONE, _TakeState.FAILED):
                    return []
                take.state = _TakeState.FAILED
                kept = "The recording was saved." if audio_saved else "The recording could not be saved either."
                failed = f"Transcription failed: {message}. {kept}"
                return [PlaySound(Sound.ERROR), Notify(Level.ERROR, failed), *self._flush()]
            case SettingsChanged(settings):
                self.settings = settings
                return []
        raise TypeError(f"not a session event: {event!r}")

    # ---- recorder ----

    def _is_current(self, take_id: int) -> bool:
        return self._recording is not None and self._recording.take_id == take_id

    def _start(self, t: float, *, hands_free: bool) -> list[Action]:
        if self._model is ModelState.NOT_CHOSEN:
            return [PlaySound(Sound.ERROR), Notify(Level.ERROR, NO_MODEL_MESSAGE), ShowModelChoice()]
        self._last_take_id += 1
        max_s = self.settings.max_recording_s
        deadline = None if max_s is None else t + max_s
        self._recording = _Recording(self._last_take_id, t, deadline, hands_free)
        actions: list[Action] = [StartCapture(self._last_take_id)]
        actions += self._ensure_loading()  # an unloaded model loads while the user speaks
        if deadline is not None:
            actions.append(ScheduleTick(deadline))
        return actions

    def _stop_by_user(self, t: float) -> list[Action]:
        rec = self._recording
        self._recording = None
        if t - rec.started_at < self.settings.min_press_s:
            return [DiscardCapture(rec.take_id)]
        return self._finish(rec, cue=Sound.STOP)

    def _max_length_stop(self, rec: _Recording) -> list[Action]:
        self._recording = None
        limit = "" if rec.deadline is None else f" of {round(rec.deadline - rec.started_at, 3):g} s"
        stopped = f"Recording stopped at the maximum length{limit}."
        return [*self._finish(rec, cue=Sound.STOP), Notify(Level.INFO, stopped)]

    def _finish(self, rec: _Recording, *, cue: Sound) -> list[Action]:
        """Save the recording and queue it (the recorder is already cleared)."""
        take_id = rec.take_id
        actions: list[Action] = [StopCapture(take_id)]
        if self._model in (ModelState.FAILED, ModelState.NOT_CHOSEN):
            reason = self._unavailable_reason()
            return [
                *actions,
                SkipTranscription(take_id, reason),
                PlaySound(Sound.ERROR),
                Notify(Level.WARNING, f"{reason}. The recording was not transcribed."),
            ]
        actions.append(PlaySound(cue))
        if self._model is ModelState.READY:
            self._queue[take_id] = _QueuedTake(_TakeState.TRANSCRIBING)
            return [*actions, Transcribe(take_id)]
        first_waiting = not self._waiting()
        self._queue[take_id] = _QueuedTake(_TakeState.WAITING_FOR_MODEL)
        actions += self._ensure_loading()
        if first_waiting:
            actions.append(Notify(Level.INFO, WAITING_MESSAGE))
        return actions

    # ---- model and takes ----

    def _waiting(self) -> list[int]:
        return [take_id for take_id, take in self._queue.items() if take.state is _TakeState.WAITING_FOR_MODEL]

    def _ensure_loading(self) -> list[Action]:
        if self._model is not ModelState.UNLOADED:
            return []
        self._model = ModelState.LOADING
        return [LoadModel()]

    def _model_ready(self) -> list[Action]:
        self._model, self._model_error = ModelState.READY, None
        actions: list[Action] = []
        for take_id in self._waiting():
            self._queue[take_id].state = _TakeState.TRANSCRIBING
            actions.append(Transcribe(take_id))
        if self._announce_ready:
            self._announce_ready = False
            actions.append(Notify(Level.INFO, "Speech model ready."))
        return actions

    def _unavailable_reason(self) -> str:
        if self._model is ModelState.NOT_CHOSEN:
            return f"Speech model unavailable: {NO_MODEL_REASON}"
        return f"Speech model unavailable: {self._model_error}"

    def _model_not_chosen(self) -> list[Action]:
        self._model, self._model_error = ModelState.NOT_CHOSEN, None
        self._announce_ready = True  # once one is chosen and loaded, say so
        skipped = self._waiting()
        actions: list[Action] = []
        for take_id in skipped:
            del self._queue[take_id]
            actions.append(SkipTranscription(take_id, self._unavailable_reason()))
        if skipped:
            text = f"No speech model is chosen: {len(skipped)} recording(s) saved but not transcribed."
            actions += [PlaySound(Sound.ERROR), Notify(Level.WARNING, text)]
        return [*actions, *self._flush()]

    def _model_failed(self, message: str) -> list[Action]:
        self._model, self._model_error = ModelState.FAILED, message
        self._announce_ready = True
        skipped = self._waiting()
        reason = f"Speech model unavailable: {message}"
        actions: list[Action] = []
        for take_id in skipped:
            del self._queue[take_id]
            actions.append(SkipTranscription(take_id, reason))
        text = f"Speech model failed to load: {message}"
        if skipped:
            text += f". {len(skipped)} recording(s) saved but not transcribed"
        return [*actions, PlaySound(Sound.ERROR), Notify(Level.ERROR, text + "."), *self._flush()]

    def _flush(self) -> list[Action]:
        """Deliver finished takes from the head of the FIFO; a failed take just makes way."""
        actions: list[Action] = []
        while self._queue:
            take_id, take = next(iter(self._queue.items()))
            if take.state is _TakeState.DONE:
                if take.text.strip():
                    actions.append(DeliverText(take_id, take.text, take.language))
                else:
                    actions.append(Notify(Level.INFO, NO_SPEECH_MESSAGE))
            elif take.state is not _TakeState.FAILED:
                break
            del self._queue[take_id]
        return actions
