"""The session's vocabulary (`dictation.session` runs the machine): its settings and states, the events
it is fed and the actions it answers with. `dictation.session` re-exports every name here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Mode(str, Enum):
    PUSH_TO_TALK = "push_to_talk"
    TOGGLE = "toggle"
    HYBRID = "hybrid"


class ModelState(str, Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNLOADED = "unloaded"
    NOT_CHOSEN = "not_chosen"


class Status(str, Enum):
    """The single state shown by the tray."""

    IDLE = "idle"
    LOADING = "loading"
    RECORDING = "recording"
    TRANSCRIBING = "transcribing"
    ERROR = "error"


class Sound(str, Enum):
    START = "start"
    STOP = "stop"
    CANCEL = "cancel"
    ERROR = "error"


class Level(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class SessionSettings:
    mode: Mode = Mode.PUSH_TO_TALK
    hold_threshold_s: float = 0.3  # hybrid: a longer hold is push-to-talk, a shorter tap hands-free
    min_press_s: float = 0.15  # user-stopped recordings shorter than this are discarded
    max_recording_s: float | None = None  # None: no limit

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.hold_threshold_s < 0 or self.min_press_s < 0:
            raise ValueError("hold_threshold_s and min_press_s must be >= 0")
        if self.max_recording_s is not None and self.max_recording_s <= 0:
            raise ValueError("max_recording_s must be > 0 or None")


# ---- events (inputs) ----


@dataclass(frozen=True)
class HotkeyDown:
    t: float


@dataclass(frozen=True)
class HotkeyUp:
    t: float


@dataclass(frozen=True)
class ToggleRequested:
    """Tray click, `dictation toggle`."""

    t: float


@dataclass(frozen=True)
class StartRequested:
    t: float


@dataclass(frozen=True)
class StopRequested:
    t: float


@dataclass(frozen=True)
class CancelRequested:
    """Esc / cancel hotkey / `dictation cancel`."""


@dataclass(frozen=True)
class ModelLoading:
    """The app started (re)loading the model, e.g. after a settings change or a retry."""


@dataclass(frozen=True)
class ModelReady:
    pass


@dataclass(frozen=True)
class ModelFailed:
    message: str


@dataclass(frozen=True)
class ModelUnloaded:
    """The app freed the model (idle unload); the next recording asks for `LoadModel`."""


@dataclass(frozen=True)
class ModelNotChosen:
    """No speech model is set (the setting is empty): there is nothing to load until the user picks one."""


@dataclass(frozen=True)
class RecordingStarted:
    take_id: int


@dataclass(frozen=True)
class RecordingFailed:
    take_id: int
    message: str


@dataclass(frozen=True)
class RecordingLost:
    take_id: int
    message: str
    partial_audio_available: bool


@dataclass(frozen=True)
class MaxLengthReached:
    take_id: int


@dataclass(frozen=True)
class TranscriptionDone:
    take_id: int
    text: str
    language: str | None = None


@dataclass(frozen=True)
class TranscriptionFailed:
    take_id: int
    message: str
    audio_saved: bool = True  # False: the recording could not be written either (disk full, read-only)


@dataclass(frozen=True)
class Tick:
    t: float


@dataclass(frozen=True)
class SettingsChanged:
    settings: SessionSettings


# fmt: off
Event = (
    HotkeyDown | HotkeyUp | ToggleRequested | StartRequested | StopRequested | CancelRequested | ModelLoading
    | ModelReady | ModelFailed | ModelUnloaded | ModelNotChosen | RecordingStarted | RecordingFailed | RecordingLost
    | MaxLengthReached | TranscriptionDone | TranscriptionFailed | Tick | SettingsChanged
)
# fmt: on

# ---- actions (outputs) ----


@dataclass(frozen=True)
class StartCapture:
    take_id: int


@dataclass(frozen=True)
class StopCapture:
    """Stop the mic and save the audio of this take to disk (before any `Transcribe` of it)."""

    take_id: int


@dataclass(frozen=True)
class DiscardCapture:
    take_id: int


@dataclass(frozen=True)
class LoadModel:
    pass


@dataclass(frozen=True)
class Transcribe:
    """Answer with `TranscriptionDone` or `TranscriptionFailed` (also if the audio could not be saved)."""

    take_id: int


@dataclass(frozen=True)
class SkipTranscription:
    """The take's saved audio stays (history shows it untranscribed); nothing will be typed for it."""

    take_id: int
    reason: str


@dataclass(frozen=True)
class DeliverText:
    """Put the text in history, then type it into the focused window."""

    take_id: int
    text: str
    language: str | None = None


@dataclass(frozen=True)
class Notify:
    level: Level
    message: str


@dataclass(frozen=True)
class PlaySound:
    kind: Sound


@dataclass(frozen=True)
class ScheduleTick:
    """Send `Tick(t)` once the monotonic clock reaches `at_t`."""

    at_t: float


@dataclass(frozen=True)
class ShowModelChoice:
    """Show the user where to choose a speech model (the settings window's Model page)."""


@dataclass(frozen=True)
class SetStatus:
    status: Status


# fmt: off
Action = (
    StartCapture | StopCapture | DiscardCapture | LoadModel | Transcribe | SkipTranscription | DeliverText | Notify
    | PlaySound | ScheduleTick | ShowModelChoice | SetStatus
)
# fmt: on
