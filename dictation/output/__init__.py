"""Putting dictated text into the focused window (Qt-free).

Typical use, from a worker thread (delivery blocks while keys are sent)::

    from dictation.output import OutputOptions, TextOptions, apply_textops, choose_backend

    output = choose_backend(OutputOptions(restore_delay_ms=1000))   # once; log output.describe()
    text = apply_textops(transcript, TextOptions(trailing_space=True))
    history.add(text)                          # the caller's job, before delivering
    result = output.deliver(text)              # DeliveryResult(method, ok, message, ...)
    if not result.ok:
        notify(result.message)                 # the text is on the clipboard when on_clipboard
    ...
    output.flush()                             # on quit: restore a pending clipboard now

Backends (`BACKEND_NAMES`), chosen per session by `choose_backend` (see `select` for the order),
narrowed by `OutputOptions(method="paste"|"type")` and `OutputOptions(backend=<tool or name>)`;
from the app's settings: `OutputOptions.from_settings(settings.output)` and
`TextOptions.from_settings(settings.output)`. Unicode: whether "Grüße 你好" arrives intact.

| backend       | session           | how                                      | Unicode | tested here         |
|---------------|-------------------|------------------------------------------|---------|---------------------|
| xdotool-paste | X11               | xclip/xsel + `xdotool key` chord         | yes     | Xvfb + Qt window    |
| xdotool-type  | X11               | `xdotool type` (+ xmodmap pre-binding)   | yes [1] | Xvfb + Qt window    |
| pynput-type   | X11               | pynput Controller.type                   | no [2]  | ASCII, if pynput    |
| pynput-type   | Windows, macOS    | SendInput KEYEVENTF_UNICODE / CGEvent    | yes     | no                  |
| pynput-paste  | macOS             | pbcopy + Cmd+V via pynput                | yes     | no                  |
| pynput-paste  | Windows           | unavailable: no clipboard code yet       | -       | fakes only          |
| wtype-paste   | Wayland (wlroots) | wl-copy + `wtype -M ctrl -k v -m ctrl`   | yes     | headless sway + Qt  |
| wtype-type    | Wayland (wlroots) | `wtype -` (uploads a keymap per run)     | yes     | headless sway + Qt  |
| ydotool-paste | Wayland (uinput)  | wl-copy + `ydotool key` keycodes         | yes [3] | fakes only          |
| ydotool-type  | Wayland (uinput)  | `ydotool type`                           | no [2]  | fakes only          |
| clipboard     | any               | copy only; the user pastes               | yes     | Xvfb                |

[1] xdotool types a character outside the keymap by remapping a spare keycode per key, which a
slow client misses ("Grüße" -> "Grße" at 40 and 80 ms/key on a loaded machine). With xmodmap
installed the text's characters are bound to spare keycodes first and unbound 2 s after the
last key (`x11keymap`), which held up under load at 12 ms/key; without it, 40 ms/key and luck.
[2] these refuse non-ASCII text without sending anything, and the chain falls back to the
clipboard. [3] ydotool sends physical keycodes: V must be where QWERTY has it.

Failure semantics: `ok` is True only when the text was handed to the focused window through a path
that reports errors; it is never True when nothing was sent. A failed paste leaves the text on the
clipboard (`on_clipboard`); when every backend fails the chain copies it there and says so. Arrival
in the window itself cannot be observed by a generic tool; the tests observe it in a real window.
"""

from dictation.output.base import (
    Availability,
    Chord,
    ClipboardError,
    DeliveryResult,
    InjectionError,
    OutputBackend,
    OutputError,
    OutputOptions,
    PendingRestore,
    RestoreOutcome,
)
from dictation.output.clipboard import ClipboardSnapshot, Selection
from dictation.output.environment import Session, detect_session
from dictation.output.paste import ClipboardRestore
from dictation.output.select import (
    AUTO_ORDER,
    BACKEND_NAMES,
    TOOLS,
    BackendStatus,
    OutputChain,
    available_backends,
    choose_backend,
    diagnose,
    plan_backends,
)
from dictation.output.textops import Replacement, TextOptions
from dictation.output.textops import apply as apply_textops

__all__ = [
    "AUTO_ORDER",
    "BACKEND_NAMES",
    "Availability",
    "BackendStatus",
    "Chord",
    "ClipboardError",
    "ClipboardRestore",
    "ClipboardSnapshot",
    "DeliveryResult",
    "InjectionError",
    "OutputBackend",
    "OutputChain",
    "OutputError",
    "OutputOptions",
    "Replacement",
    "PendingRestore",
    "RestoreOutcome",
    "Selection",
    "Session",
    "TOOLS",
    "TextOptions",
    "apply_textops",
    "available_backends",
    "choose_backend",
    "detect_session",
    "diagnose",
    "plan_backends",
]
