"""The dictation lifecycle as tables: (settings, model state, events with times) -> exact actions.

Each step is `(event, actions expected from that event)`; a case also names the status it ends in.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

import dictation.session as session_module
import dictation.session_events as session_events
from dictation.session import (
    NO_MODEL_MESSAGE,
    NO_SPEECH_MESSAGE,
    WAITING_MESSAGE,
    CancelRequested,
    DeliverText,
    DictationSession,
    DiscardCapture,
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

Down, Up, Done = HotkeyDown, HotkeyUp, TranscriptionDone
PTT, TOGGLE, HYBRID = Mode.PUSH_TO_TALK, Mode.TOGGLE, Mode.HYBRID
IDLE, LOADING, REC, TRANS, ERROR = (SetStatus(s) for s in Status.__members__.values())
START, STOP, CANCEL, ERR_SOUND = (PlaySound(k) for k in Sound)
OOM = "CUDA out of memory"
UNAVAILABLE = f"Speech model unavailable: {OOM}"
NO_MODEL = "Speech model unavailable: no speech model is chosen"
REFUSED = [ERR_SOUND, Notify(Level.ERROR, NO_MODEL_MESSAGE), ShowModelChoice()]  # a press without a model


def stopped(take_id: int) -> list:
    """What a normal stop emits while the model is ready."""
    return [StopCapture(take_id), Transcribe(take_id), STOP]


@dataclass
class Case:
    name: str
    steps: list[tuple[object, list]]
    mode: Mode = PTT
    model: ModelState = ModelState.READY
    max_s: float | None = None
    end: Status = Status.IDLE


def run(case: Case) -> DictationSession:
    session = DictationSession(SessionSettings(mode=case.mode, max_recording_s=case.max_s), model_state=case.model)
    for i, (event, expected) in enumerate(case.steps):
        assert session.handle(event) == expected, f"step {i}: {event}"
    assert session.status is case.end
    return session


# fmt: off
CASES = [
    # ---- push-to-talk ----
    Case("ptt: hold, speak, release -> text typed", [
        (Down(10.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),  # the cue comes when the mic is live
        (Up(12.5), [*stopped(1), TRANS]),
        (Done(1, "hello world", "English"), [DeliverText(1, "hello world", "English"), IDLE]),
    ]),
    Case("ptt: a tap shorter than min_press_s is discarded, nothing typed", [
        (Down(1.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),
        (Up(1.1), [DiscardCapture(1), IDLE]),
        (Down(3.0), [StartCapture(2), REC]),  # the next press works normally, with a fresh id
        (Up(5.0), [*stopped(2), TRANS]),
    ], end=Status.TRANSCRIBING),
    Case("ptt: a press of exactly min_press_s is kept", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(0.15), [*stopped(1), TRANS]),
    ], end=Status.TRANSCRIBING),
    Case("ptt: auto-repeat downs are ignored, one recording", [
        (Down(0.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),
        (Down(0.5), []), (Down(0.53), []), (Down(0.56), []),
        (Up(2.0), [*stopped(1), TRANS]),
        (Up(2.1), []),  # a stray release
    ], end=Status.TRANSCRIBING),
    Case("ptt: a release with no press is ignored", [
        (Up(0.0), []),
        (Down(1.0), [StartCapture(1), REC]),
    ], end=Status.RECORDING),
    Case("ptt: a lost release heals on the next press-release", [
        (Down(0.0), [StartCapture(1), REC]),
        (Down(5.0), []),  # looks like a repeat: the backend lost the release
        (Up(5.2), [*stopped(1), TRANS]),
        (Down(6.0), [StartCapture(2), REC]),
    ], end=Status.RECORDING),
    Case("ptt: a press stops a hands-free recording started over IPC; its release does nothing", [
        (StartRequested(0.0), [StartCapture(1), REC]),
        (Down(5.0), [*stopped(1), TRANS]),
        (Up(5.2), []),
    ], end=Status.TRANSCRIBING),
    Case("ptt: tray toggle while holding stops; the release does nothing", [
        (Down(0.0), [StartCapture(1), REC]),
        (ToggleRequested(1.0), [*stopped(1), TRANS]),
        (Up(2.0), []),
    ], end=Status.TRANSCRIBING),
    # ---- toggle ----
    Case("toggle: press starts, release ignored, next press stops", [
        (Down(0.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),
        (Up(0.2), []),
        (Down(3.0), [*stopped(1), TRANS]),
        (Up(3.1), []),
        (Done(1, "note"), [DeliverText(1, "note"), IDLE]),
    ], mode=TOGGLE),
    Case("toggle: auto-repeat while holding the start press does not stop", [
        (Down(0.0), [StartCapture(1), REC]),
        (Down(0.5), []), (Down(0.53), []),
        (Up(0.6), []),
        (Down(2.0), [*stopped(1), TRANS]),
    ], mode=TOGGLE, end=Status.TRANSCRIBING),
    Case("toggle: an accidental double tap is discarded", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(0.05), []),
        (Down(0.1), [DiscardCapture(1), IDLE]),
        (Up(0.12), []),
    ], mode=TOGGLE),
    # ---- hybrid ----
    Case("hybrid: a tap goes hands-free, the next press stops", [
        (Down(0.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),
        (Up(0.2), []),  # shorter than hold_threshold_s: keep recording
        (Down(4.0), [*stopped(1), TRANS]),
        (Up(4.1), []),
    ], mode=HYBRID, end=Status.TRANSCRIBING),
    Case("hybrid: a tap shorter than min_press_s still goes hands-free", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(0.05), []),
        (Down(3.0), [*stopped(1), TRANS]),
    ], mode=HYBRID, end=Status.TRANSCRIBING),
    Case("hybrid: a hold is push-to-talk, stopped on release", [
        (Down(0.0), [StartCapture(1), REC]),
        (Down(0.5), []),  # repeat
        (Up(0.8), [*stopped(1), TRANS]),
        (Down(2.0), [StartCapture(2), REC]),  # next press starts anew
    ], mode=HYBRID, end=Status.RECORDING),
    Case("hybrid: a hold of exactly hold_threshold_s is push-to-talk", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(0.3), [*stopped(1), TRANS]),
    ], mode=HYBRID, end=Status.TRANSCRIBING),
    # ---- cancel ----
    Case("cancel while pressed (ptt): discarded; repeats and the release do nothing", [
        (Down(0.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),
        (CancelRequested(), [DiscardCapture(1), CANCEL, IDLE]),
        (Down(0.5), []),
        (Up(2.0), []),
        (CancelRequested(), []),
    ]),
    Case("cancel hands-free (toggle): discarded; the next press starts a new recording", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(0.1), []),
        (CancelRequested(), [DiscardCapture(1), CANCEL, IDLE]),
        (Down(2.0), [StartCapture(2), REC]),
    ], mode=TOGGLE, end=Status.RECORDING),
    Case("cancel hands-free (hybrid tap)", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(0.1), []),
        (CancelRequested(), [DiscardCapture(1), CANCEL, IDLE]),
        (Down(2.0), [StartCapture(2), REC]),
    ], mode=HYBRID, end=Status.RECORDING),
    Case("cancel while held (hybrid): the release does nothing", [
        (Down(0.0), [StartCapture(1), REC]),
        (CancelRequested(), [DiscardCapture(1), CANCEL, IDLE]),
        (Up(1.0), []),
    ], mode=HYBRID),
    Case("cancel an IPC recording", [
        (StartRequested(0.0), [StartCapture(1), REC]),
        (CancelRequested(), [DiscardCapture(1), CANCEL, IDLE]),
        (StopRequested(1.0), []),
    ]),
    Case("cancel does not touch takes already transcribing", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (CancelRequested(), []),
        (Down(2.0), [StartCapture(2), REC]),
        (CancelRequested(), [DiscardCapture(2), CANCEL, TRANS]),
        (Done(1, "kept"), [DeliverText(1, "kept"), IDLE]),
    ]),
    # ---- overlapping recording and transcription ----
    Case("press while transcribing: new recording, results in order", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (Down(2.0), [StartCapture(2), REC]),
        (Done(1, "one"), [DeliverText(1, "one")]),  # typed while recording take 2
        (Up(3.0), [*stopped(2), TRANS]),
        (Done(2, "two"), [DeliverText(2, "two"), IDLE]),
    ]),
    Case("out-of-order completion is delivered in take order", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (Down(2.0), [StartCapture(2), REC]),
        (Up(3.0), [*stopped(2), TRANS]),
        (Down(4.0), [StartCapture(3), REC]),
        (Up(5.0), [*stopped(3), TRANS]),
        (Done(3, "three"), []),
        (Done(2, "two"), []),
        (Done(1, "one"), [DeliverText(1, "one"), DeliverText(2, "two"), DeliverText(3, "three"), IDLE]),
    ]),
    Case("a failed take does not block later ones", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (Down(2.0), [StartCapture(2), REC]),
        (Up(3.0), [*stopped(2), TRANS]),
        (Down(4.0), [StartCapture(3), REC]),
        (Up(5.0), [*stopped(3), TRANS]),
        (Done(2, "two"), []),
        (TranscriptionFailed(1, "decoder error"), [
            DeliverText(2, "two"), ERR_SOUND,
            Notify(Level.ERROR, "Transcription failed: decoder error. The recording was saved."),
        ]),
        (TranscriptionFailed(3, "decoder error"), [
            ERR_SOUND, Notify(Level.ERROR, "Transcription failed: decoder error. The recording was saved."), IDLE,
        ]),
    ]),
    Case("a failure of a take whose audio could not be saved says so, never 'saved'", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (TranscriptionFailed(1, "decoder error", audio_saved=False), [
            ERR_SOUND,
            Notify(Level.ERROR, "Transcription failed: decoder error. The recording could not be saved either."),
            IDLE,
        ]),
    ]),
    Case("empty transcript: nothing typed, a gentle note at its turn", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (Down(2.0), [StartCapture(2), REC]),
        (Up(3.0), [*stopped(2), TRANS]),
        (Done(2, " \n"), []),
        (Done(1, "one"), [DeliverText(1, "one"), Notify(Level.INFO, NO_SPEECH_MESSAGE), IDLE]),
    ]),
    Case("late, duplicate and unknown worker results are ignored", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (Done(7, "ghost"), []),
        (Done(1, "one"), [DeliverText(1, "one"), IDLE]),
        (Done(1, "one"), []),
        (TranscriptionFailed(1, "late"), []),
        (RecordingStarted(1), []),
        (RecordingLost(1, "gone", True), []),
        (MaxLengthReached(1), []),
    ]),
    # ---- model loading, failure, unloading ----
    Case("press while loading: recorded, transcribed after ModelReady, order kept", [
        (Down(0.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),
        (Up(1.0), [StopCapture(1), STOP, Notify(Level.INFO, WAITING_MESSAGE), LOADING]),
        (Down(2.0), [StartCapture(2), REC]),
        (Up(3.0), [StopCapture(2), STOP, LOADING]),  # told once
        (ToggleRequested(4.0), [StartCapture(3), REC]),
        (ToggleRequested(5.0), [StopCapture(3), STOP, LOADING]),
        (ModelReady(), [Transcribe(1), Transcribe(2), Transcribe(3), TRANS]),
        (Done(2, "two"), []),
        (Done(1, "one"), [DeliverText(1, "one"), DeliverText(2, "two")]),
        (Done(3, "three"), [DeliverText(3, "three"), IDLE]),
    ], model=ModelState.LOADING),
    Case("model ready while recording: that recording is transcribed at once", [
        (Down(0.0), [StartCapture(1), REC]),
        (ModelReady(), []),
        (Up(1.0), [*stopped(1), TRANS]),
    ], model=ModelState.LOADING, end=Status.TRANSCRIBING),
    Case("model failure: queued audio kept untranscribed; recording still works; recovery", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [StopCapture(1), STOP, Notify(Level.INFO, WAITING_MESSAGE), LOADING]),
        (ModelFailed(OOM), [
            SkipTranscription(1, UNAVAILABLE), ERR_SOUND,
            Notify(Level.ERROR, f"Speech model failed to load: {OOM}. 1 recording(s) saved but not transcribed."),
            ERROR,
        ]),
        (Down(2.0), [StartCapture(2), REC]),
        (RecordingStarted(2), [START]),
        (Up(3.0), [
            StopCapture(2), SkipTranscription(2, UNAVAILABLE), ERR_SOUND,
            Notify(Level.WARNING, f"{UNAVAILABLE}. The recording was not transcribed."), ERROR,
        ]),
        (ModelLoading(), [LOADING]),  # the app retries
        (ModelReady(), [Notify(Level.INFO, "Speech model ready."), IDLE]),
        (Down(5.0), [StartCapture(3), REC]),
        (Up(6.0), [*stopped(3), TRANS]),
        (Done(3, "back"), [DeliverText(3, "back"), IDLE]),
    ], model=ModelState.LOADING),
    Case("model failure at startup with nothing queued, then ready", [
        (ModelFailed("no model folder"), [
            ERR_SOUND, Notify(Level.ERROR, "Speech model failed to load: no model folder."), ERROR,
        ]),
        (ModelReady(), [Notify(Level.INFO, "Speech model ready."), IDLE]),
    ], model=ModelState.LOADING),
    Case("model failure while a take is transcribing: that take is still delivered", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (ModelLoading(), [LOADING]),  # a settings change reloads the model
        (ModelFailed(OOM), [ERR_SOUND, Notify(Level.ERROR, f"Speech model failed to load: {OOM}."), ERROR]),
        (Done(1, "one"), [DeliverText(1, "one")]),
    ], end=Status.ERROR),
    Case("model failure during a recording: status stays recording until the stop", [
        (Down(0.0), [StartCapture(1), REC]),
        (ModelFailed(OOM), [ERR_SOUND, Notify(Level.ERROR, f"Speech model failed to load: {OOM}.")]),
        (Up(1.0), [
            StopCapture(1), SkipTranscription(1, UNAVAILABLE), ERR_SOUND,
            Notify(Level.WARNING, f"{UNAVAILABLE}. The recording was not transcribed."), ERROR,
        ]),
    ], model=ModelState.LOADING, end=Status.ERROR),
    Case("unloaded model: loading starts with the recording and overlaps the speech", [
        (Down(0.0), [StartCapture(1), LoadModel(), REC]),
        (Up(2.0), [StopCapture(1), STOP, Notify(Level.INFO, WAITING_MESSAGE), LOADING]),
        (ModelReady(), [Transcribe(1), TRANS]),
        (Done(1, "warm"), [DeliverText(1, "warm"), IDLE]),
        (ModelUnloaded(), []),  # idle unload: still idle for the tray
        (Down(5.0), [StartCapture(2), LoadModel(), REC]),
    ], model=ModelState.UNLOADED, end=Status.RECORDING),
    Case("unloaded while takes wait: the machine asks for a load again", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [StopCapture(1), STOP, Notify(Level.INFO, WAITING_MESSAGE), LOADING]),
        (ModelUnloaded(), [LoadModel()]),
        (ModelReady(), [Transcribe(1), TRANS]),
    ], model=ModelState.LOADING, end=Status.TRANSCRIBING),
    # ---- no model chosen ----
    Case("no model: a press records nothing, says so at once and opens the model choice", [
        (Down(0.0), REFUSED),
        (Down(0.05), []),  # auto-repeat of the same press
        (Up(1.0), []),
        (ToggleRequested(2.0), REFUSED),  # the tray
        (StartRequested(3.0), REFUSED),  # `dictation start`
        (StopRequested(3.5), []),
        (CancelRequested(), []),
    ], model=ModelState.NOT_CHOSEN, end=Status.ERROR),
    Case("no model: in toggle and hybrid modes too", [
        (Down(0.0), REFUSED),
        (Up(0.1), []),
        (Down(1.0), REFUSED),
    ], mode=TOGGLE, model=ModelState.NOT_CHOSEN, end=Status.ERROR),
    Case("no model, then one is chosen: it loads, is announced, and a press records", [
        (Down(0.0), REFUSED),
        (Up(0.5), []),
        (ModelLoading(), [LOADING]),
        (ModelReady(), [Notify(Level.INFO, "Speech model ready."), IDLE]),
        (Down(2.0), [StartCapture(1), REC]),
        (Up(3.0), [*stopped(1), TRANS]),
    ], model=ModelState.NOT_CHOSEN, end=Status.TRANSCRIBING),
    Case("model unset while loading with a take waiting: the take is kept untranscribed", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [StopCapture(1), STOP, Notify(Level.INFO, WAITING_MESSAGE), LOADING]),
        (ModelNotChosen(), [
            SkipTranscription(1, NO_MODEL), ERR_SOUND,
            Notify(Level.WARNING, "No speech model is chosen: 1 recording(s) saved but not transcribed."), ERROR,
        ]),
        (Down(2.0), REFUSED),
    ], model=ModelState.LOADING, end=Status.ERROR),
    Case("model unset during a recording: saved and kept untranscribed at the stop; takes in work finish", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), [*stopped(1), TRANS]),
        (Down(2.0), [StartCapture(2), REC]),
        (ModelNotChosen(), []),
        (Up(3.0), [
            StopCapture(2), SkipTranscription(2, NO_MODEL), ERR_SOUND,
            Notify(Level.WARNING, f"{NO_MODEL}. The recording was not transcribed."), ERROR,
        ]),
        (Done(1, "one"), [DeliverText(1, "one")]),
    ], end=Status.ERROR),
    # ---- the recording device ----
    Case("device lost mid-recording with audio: kept, transcribed, reported; the release does nothing", [
        (Down(0.0), [StartCapture(1), REC]),
        (RecordingStarted(1), [START]),
        (RecordingLost(1, "USB headset unplugged", True), [
            StopCapture(1), Transcribe(1), ERR_SOUND,
            Notify(Level.WARNING, "Microphone lost: USB headset unplugged. The recording so far was kept."), TRANS,
        ]),
        (Down(0.5), []),
        (Up(2.0), []),
        (Done(1, "partial"), [DeliverText(1, "partial"), IDLE]),
    ]),
    Case("device lost with no audio: discarded and reported", [
        (ToggleRequested(0.0), [StartCapture(1), REC]),
        (RecordingLost(1, "device busy", False), [
            DiscardCapture(1), ERR_SOUND, Notify(Level.ERROR, "Microphone lost: device busy. Nothing was recorded."),
            IDLE,
        ]),
        (ToggleRequested(1.0), [StartCapture(2), REC]),  # the next toggle starts, it does not "stop"
    ], end=Status.RECORDING),
    Case("recording fails to start: reported, no take; the next press works", [
        (Down(0.0), [StartCapture(1), REC]),
        (RecordingFailed(1, "no input device"), [
            ERR_SOUND, Notify(Level.ERROR, "Could not start recording: no input device"), IDLE,
        ]),
        (Up(1.0), []),
        (Down(2.0), [StartCapture(2), REC]),
        (RecordingFailed(1, "stale"), []),
    ], end=Status.RECORDING),
    # ---- max length ----
    Case("max length: a Tick at the deadline stops a held recording", [
        (Down(100.0), [StartCapture(1), ScheduleTick(160.0), REC]),
        (Tick(130.0), []),  # early
        (Tick(160.0), [
            *stopped(1), Notify(Level.INFO, "Recording stopped at the maximum length of 60 s."), TRANS,
        ]),
        (Down(161.0), []),  # still held
        (Up(170.0), []),
        (Tick(175.0), []),
    ], max_s=60, end=Status.TRANSCRIBING),
    Case("max length: a stale Tick does not stop the next recording", [
        (ToggleRequested(0.0), [StartCapture(1), ScheduleTick(60.0), REC]),
        (ToggleRequested(10.0), [*stopped(1), TRANS]),
        (ToggleRequested(20.0), [StartCapture(2), ScheduleTick(80.0), REC]),
        (Tick(60.0), []),
        (Tick(80.5), [
            *stopped(2), Notify(Level.INFO, "Recording stopped at the maximum length of 60 s."), TRANS,
        ]),
    ], mode=TOGGLE, max_s=60, end=Status.TRANSCRIBING),
    Case("max length reported by the recorder", [
        (Down(0.0), [StartCapture(1), ScheduleTick(30.0), REC]),
        (MaxLengthReached(1), [
            *stopped(1), Notify(Level.INFO, "Recording stopped at the maximum length of 30 s."), TRANS,
        ]),
    ], max_s=30, end=Status.TRANSCRIBING),
    Case("recorder limit without a configured max length", [
        (Down(0.0), [StartCapture(1), REC]),
        (MaxLengthReached(1), [*stopped(1), Notify(Level.INFO, "Recording stopped at the maximum length."), TRANS]),
    ], end=Status.TRANSCRIBING),
    Case("no max length: no timer", [
        (Down(0.0), [StartCapture(1), REC]),
        (Tick(10_000.0), []),
    ], end=Status.RECORDING),
    # ---- IPC ----
    Case("IPC start/stop/toggle are idempotent", [
        (StopRequested(0.0), []),
        (StartRequested(1.0), [StartCapture(1), REC]),
        (StartRequested(1.5), []),
        (StopRequested(3.0), [*stopped(1), TRANS]),
        (StopRequested(3.5), []),
        (ToggleRequested(4.0), [StartCapture(2), REC]),
        (ToggleRequested(6.0), [*stopped(2), TRANS]),
        (CancelRequested(), []),
    ], end=Status.TRANSCRIBING),
    Case("IPC push-to-talk (bind + bindr): a quick tap is discarded", [
        (StartRequested(0.0), [StartCapture(1), REC]),
        (StopRequested(0.1), [DiscardCapture(1), IDLE]),
    ]),
    Case("IPC ignores the mode: start is hands-free even in push-to-talk", [
        (StartRequested(0.0), [StartCapture(1), REC]),
        (Up(0.5), []),
        (StopRequested(2.0), [*stopped(1), TRANS]),
    ], end=Status.TRANSCRIBING),
    # ---- settings ----
    Case("switching to toggle applies to the next press", [
        (SettingsChanged(SessionSettings(mode=TOGGLE)), []),
        (Down(0.0), [StartCapture(1), REC]),
        (Up(1.0), []),
        (Down(2.0), [*stopped(1), TRANS]),
    ], end=Status.TRANSCRIBING),
    Case("switching to push-to-talk mid hands-free: the next press still stops it", [
        (Down(0.0), [StartCapture(1), REC]),
        (Up(0.1), []),
        (SettingsChanged(SessionSettings(mode=PTT)), []),
        (Down(2.0), [*stopped(1), TRANS]),
        (Up(2.1), []),
    ], mode=TOGGLE, end=Status.TRANSCRIBING),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_table(case: Case) -> None:
    run(case)


def test_case_names_are_unique() -> None:
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("mode", list(Mode))
def test_cancel_in_every_mode_types_nothing_and_leaves_no_take(mode: Mode) -> None:
    session = DictationSession(SessionSettings(mode=mode), model_state=ModelState.READY)
    assert session.handle(Down(0.0)) == [StartCapture(1), REC]
    assert session.handle(Down(0.5)) == []
    assert session.handle(CancelRequested()) == [DiscardCapture(1), CANCEL, IDLE]
    assert session.handle(Up(2.0)) == []
    assert (session.status, session.pending_takes, session.recording_take_id) == (Status.IDLE, (), None)


def test_views_track_the_overlap_of_recording_and_takes() -> None:
    session = DictationSession(SessionSettings(mode=HYBRID), model_state=ModelState.LOADING)
    assert session.status is Status.LOADING
    session.handle(Down(0.0))
    assert (session.recording_take_id, session.hands_free, session.hotkey_down) == (1, False, True)
    session.handle(Up(0.1))
    assert (session.hands_free, session.hotkey_down) == (True, False)
    session.handle(Down(2.0))
    assert (session.status, session.pending_takes, session.recording_take_id) == (Status.LOADING, (1,), None)
    session.handle(Up(2.1))  # releases the stopping press
    session.handle(Down(4.0))
    session.handle(Up(5.0))
    assert session.pending_takes == (1, 2)
    assert session.model_state is ModelState.LOADING


def test_settings_validation_and_mode_from_settings_text() -> None:
    assert SessionSettings(mode="hybrid").mode is Mode.HYBRID
    for bad in ({"min_press_s": -1}, {"hold_threshold_s": -0.1}, {"max_recording_s": 0}):
        with pytest.raises(ValueError):
            SessionSettings(**bad)
    with pytest.raises(ValueError):
        SessionSettings(mode="walkie-talkie")


def test_unknown_event_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="not a session event"):
        DictationSession().handle(StartCapture(1))


def test_module_is_pure_stdlib_and_qt_free() -> None:
    """The machine and its vocabulary import only dataclasses and enum, and the machine the vocabulary."""
    imported = set()
    for module in (session_module, session_events):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module)
    assert imported <= {"__future__", "dataclasses", "enum", "dictation.session_events"}


# ---- random event streams against invariants the app relies on ----


class FakeApp:
    """Plays the app: performs actions, answers with plausible (random, late, out-of-order) events."""

    def __init__(self, rng: random.Random, mode: Mode) -> None:
        self.rng = rng
        settings = SessionSettings(mode=mode, max_recording_s=rng.choice([None, 5.0]))
        self.session = DictationSession(settings, model_state=rng.choice(list(ModelState)))
        self.t = 0.0
        self.capturing: int | None = None
        self.started: list[int] = []
        self.ended: set[int] = set()  # stopped, discarded or failed to start
        self.saved: set[int] = set()
        self.transcribing: list[int] = []
        self.transcribed: set[int] = set()
        self.skipped: set[int] = set()
        self.delivered: list[int] = []
        self.model_ready = self.session.model_state is ModelState.READY

    def step(self, event) -> None:
        status_before = self.session.status
        actions = self.session.handle(event)
        statuses = [a for a in actions if isinstance(a, SetStatus)]
        assert not statuses or statuses == [actions[-1]], actions
        assert (statuses[0].status if statuses else status_before) is self.session.status
        if statuses:
            assert statuses[0].status is not status_before
        for action in actions:
            self.perform(action)

    def perform(self, action) -> None:
        match action:
            case StartCapture(take_id):
                assert self.capturing is None and take_id == len(self.started) + 1
                self.started.append(take_id)
                self.capturing = take_id
            case StopCapture(take_id) | DiscardCapture(take_id):
                assert self.capturing == take_id
                self.capturing = None
                self.ended.add(take_id)
                if isinstance(action, StopCapture):
                    self.saved.add(take_id)
            case Transcribe(take_id):
                assert self.model_ready and take_id in self.saved and take_id not in self.transcribed
                self.transcribed.add(take_id)
                self.transcribing.append(take_id)
            case SkipTranscription(take_id, _):
                assert take_id in self.saved and take_id not in self.transcribed
                self.skipped.add(take_id)
            case DeliverText(take_id, _):
                assert take_id in self.transcribed
                self.delivered.append(take_id)

    def random_event(self):
        rng, s = self.rng, self.session
        self.t += rng.choice([0.01, 0.1, 0.2, 0.5, 2.0, 6.0])
        choices = [
            lambda: Down(self.t),
            lambda: Up(self.t),
            lambda: ToggleRequested(self.t),
            lambda: StartRequested(self.t),
            lambda: StopRequested(self.t),
            CancelRequested,
            lambda: Tick(self.t),
            ModelReady,
            ModelLoading,
            ModelUnloaded,
            ModelNotChosen,
            lambda: ModelFailed("boom"),
        ]
        if s.recording_take_id is not None:
            take = s.recording_take_id
            choices += [
                lambda: RecordingStarted(take),
                lambda: RecordingFailed(take, "x"),
                lambda: RecordingLost(take, "x", rng.random() < 0.5),
                lambda: MaxLengthReached(take),
            ]
        if self.transcribing and rng.random() < 0.4:
            take = self.transcribing.pop(rng.randrange(len(self.transcribing)))
            text = rng.choice(["words", "", "more words"])
            return rng.choice([Done(take, text), Done(take, text), TranscriptionFailed(take, "x")])
        return rng.choice(choices)()

    def note_model(self, event) -> None:
        if isinstance(event, ModelReady):
            self.model_ready = True
        elif isinstance(event, ModelLoading | ModelUnloaded | ModelFailed | ModelNotChosen):
            self.model_ready = False


@pytest.mark.parametrize("seed", range(60))
def test_random_streams_keep_the_contract(seed: int) -> None:
    rng = random.Random(seed)
    app = FakeApp(rng, rng.choice(list(Mode)))
    for _ in range(300):
        event = app.random_event()
        if isinstance(event, RecordingFailed):
            app.capturing = None  # the app's capture failed: no Stop/Discard follows
            app.ended.add(event.take_id)
        app.note_model(event)
        app.step(event)
    # Drain: stop any recording, make the model ready, finish all work.
    app.t += 10
    for event in (CancelRequested(), ModelReady()):
        app.note_model(event)
        app.step(event)
    while app.transcribing:
        app.step(Done(app.transcribing.pop(), "last"))
    assert app.session.status is Status.IDLE and app.session.pending_takes == ()
    assert app.ended == set(app.started)  # every capture ended exactly once (asserted in perform)
    assert app.saved == app.transcribed | app.skipped and not app.transcribed & app.skipped
    assert app.delivered == sorted(app.delivered)  # typed in recording order
