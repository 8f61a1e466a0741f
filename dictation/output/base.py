"""The shared vocabulary of the output package: options, results, the backend protocol, errors."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dictation.config.settings import OutputSettings


class OutputError(Exception):
    """Base of the package's typed errors."""


class ClipboardError(OutputError):
    """Reading or writing the clipboard failed."""


class InjectionError(OutputError):
    """Sending keys failed. `input_sent` is True when some input may have reached the window."""

    def __init__(self, message: str, *, input_sent: bool = False):
        super().__init__(message)
        self.input_sent = input_sent


class Chord(str, enum.Enum):
    """Paste key chords. Shift+Insert pastes PRIMARY in xterm/urxvt, so it is sent with both selections set."""

    CTRL_V = "ctrl+v"
    CTRL_SHIFT_V = "ctrl+shift+v"
    SHIFT_INSERT = "shift+insert"
    CMD_V = "cmd+v"

    @property
    def modifiers(self) -> tuple[str, ...]:
        return tuple(self.value.split("+")[:-1])

    @property
    def key(self) -> str:
        return self.value.split("+")[-1]

    @property
    def needs_primary(self) -> bool:
        return self is Chord.SHIFT_INSERT


PASTE_CHORD_CHOICES = ("auto", "ctrl+v", "ctrl+shift+v", "shift+insert")
METHOD_CHOICES = ("auto", "paste", "type")


@dataclass(frozen=True)
class Availability:
    """Whether a backend can work here, and if not, why (shown in diagnostics)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class RestoreOutcome:
    restored: bool  # the CLIPBOARD selection got the user's content back
    message: str


class PendingRestore(Protocol):
    """A scheduled put-back of the user's clipboard after a paste (`paste.ClipboardRestore`): `wait()`
    returns its outcome, `cancel()` drops it, `run_now()` does it at once (e.g. on quit)."""

    @property
    def pending(self) -> bool: ...

    @property
    def outcome(self) -> RestoreOutcome | None: ...

    def start(self) -> None: ...

    def wait(self, timeout: float | None = None) -> RestoreOutcome | None: ...

    def cancel(self) -> bool: ...

    def run_now(self) -> RestoreOutcome | None: ...


@dataclass(frozen=True)
class DeliveryResult:
    """What `deliver()` did.

    `ok` is True only when the text was sent to the focused window by a path that reports errors
    (the chord or the typing tool succeeded after the clipboard was verified to hold the text). It
    is never True when nothing was sent. `on_clipboard` says the dictated text was left on the
    clipboard (after a failure, or until `restore` runs); `input_sent` says keys may have reached
    the window, so a caller must not retry with another method (the text could arrive twice).
    `held_back` says why nothing was sent on purpose (`focus.OWN_WINDOW`: one of our own windows has
    the focus; `focus.NO_WINDOW`: no window has it); the text is then on the clipboard when
    `on_clipboard`. `waited_s`: how long it waited for a hotkey of ours to be released first
    (`hold.KeyHold`): the text went out late, after the release, while the window could receive it.
    `undone` / `undo_refused`: what became of a "scratch that" in a plan (`OutputChain.perform`).
    """

    method: str
    ok: bool
    message: str
    on_clipboard: bool = False
    input_sent: bool = False
    chord: Chord | None = None
    window_class: str | None = None
    restore: PendingRestore | None = field(default=None, compare=False, repr=False)
    held_back: str | None = None
    waited_s: float = 0.0
    undone: int = 0  # "scratch that": characters of the previous dictation removed (`undo.UndoLog`)
    undo_refused: str | None = None  # "scratch that" was not performed, and why


@runtime_checkable
class OutputBackend(Protocol):
    """One way of putting text into the focused window.

    `deliver()` blocks until the text is sent (typing long text takes seconds), so call it from a
    worker thread. It never touches history: store the text first, then deliver.
    """

    name: str

    def is_available(self) -> Availability: ...

    def deliver(self, text: str) -> DeliveryResult: ...


@dataclass(frozen=True)
class OutputOptions:
    """Settings of the output path.

    method: "auto", "paste" or "type": keep only the backends that paste (clipboard + paste keys)
        or only those that type (simulated key presses). Auto: both, pasting first.
    backend: "auto", a tool ("xdotool", "wtype", "ydotool", "pynput": `dictation.output.TOOLS`) or
        a backend name (`dictation.output.BACKEND_NAMES`, e.g. "wtype-paste", "clipboard"). A named
        tool or backend skips the session heuristics (e.g. "wtype does not work on GNOME") but not
        the tool checks; a full backend name also overrides `method`. See `select.plan_backends`.
    paste_chord: "auto" (terminal detection), "ctrl+v", "ctrl+shift+v" or "shift+insert".
    restore_clipboard: put the user's previous clipboard back after pasting.
    restore_delay_ms: how long the target gets to read the clipboard first (>= 1000 recommended:
        VoiceInk#415/#722 saw restores race the paste at shorter delays).
    type_delay_ms: delay between typed keys; None = 12 ms, except 40 ms for non-ASCII text when
        xdotool has to remap keys itself (no xmodmap; it drops characters at shorter delays).
    terminal_classes: extra window classes / app_ids treated as terminals (Ctrl+Shift+V).
    command_timeout_s: limit for one tool invocation (typing gets extra time per character).
    """

    backend: str = "auto"
    paste_chord: str = "auto"
    restore_clipboard: bool = True
    restore_delay_ms: int = 1000
    type_delay_ms: int | None = None
    terminal_classes: tuple[str, ...] = ()
    command_timeout_s: float = 5.0
    method: str = "auto"  # last, so positional construction keeps its meaning

    def __post_init__(self):
        if self.method not in METHOD_CHOICES:
            raise ValueError(f"method must be one of {METHOD_CHOICES}, not {self.method!r}")
        if self.paste_chord not in PASTE_CHORD_CHOICES:
            raise ValueError(f"paste_chord must be one of {PASTE_CHORD_CHOICES}, not {self.paste_chord!r}")
        if self.restore_delay_ms < 0:
            raise ValueError("restore_delay_ms must be >= 0")
        if self.type_delay_ms is not None and self.type_delay_ms < 0:
            raise ValueError("type_delay_ms must be >= 0")
        object.__setattr__(self, "terminal_classes", tuple(self.terminal_classes))

    @classmethod
    def coerce(cls, settings: object | None) -> OutputOptions:
        """Accept OutputOptions, None (defaults) or any settings object with attributes of the same
        names, optionally prefixed with `output_` (e.g. `output_backend`, `output_paste_chord`)."""
        if settings is None:
            return cls()
        if isinstance(settings, cls):
            return settings
        values = {}
        for f in fields(cls):
            for attr in (f.name, f"output_{f.name}"):
                if hasattr(settings, attr):
                    values[f.name] = getattr(settings, attr)
                    break
        return cls(**values)

    @classmethod
    def from_settings(cls, output: OutputSettings) -> OutputOptions:
        """The output path's part of the app's settings (`dictation.config.settings.OutputSettings`;
        its text options go to `TextOptions.from_settings`)."""
        return cls(
            method=output.method,
            backend=output.backend,
            paste_chord=output.paste_chord,
            restore_clipboard=output.restore_clipboard,
            restore_delay_ms=output.restore_delay_ms,
        )
