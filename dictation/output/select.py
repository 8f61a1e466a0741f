"""Choosing backends for the session, and the chain that tries them in order.

Auto order per session (first available wins; the clipboard is always the last resort):

| session | order                                                          |
|---------|----------------------------------------------------------------|
| X11     | xdotool-paste, xdotool-type, pynput-type                       |
| Wayland | wtype-paste, ydotool-paste, wtype-type, ydotool-type           |
| macOS   | pynput-paste (pbcopy + Cmd+V), pynput-type                     |
| Windows | pynput-paste (unavailable: no clipboard support yet), pynput-type |

xdotool and pynput are left out on Wayland on purpose: they reach only XWayland windows and fail
silently for native ones (OpenWhispr#240, #285).

The settings narrow this down (`plan_backends`; the clipboard stays the last resort throughout):

| backend            | method       | chain                                                       |
|--------------------|--------------|-------------------------------------------------------------|
| auto               | auto         | the session's auto order                                    |
| auto               | paste / type | the auto order, only *-paste / only *-type backends         |
| a tool (wtype ...) | any          | the tool's backends in the auto order, filtered by method;  |
|                    |              | if the auto order has none (xdotool on Wayland): the tool's |
|                    |              | paste then type backends, filtered by method                |
| a backend name     | ignored      | that backend alone                                          |

A named tool or backend is the user's explicit choice: it is tried without the session heuristics
(e.g. "wtype does not work on GNOME", "xdotool reaches only XWayland windows") but with the tool
checks (installed, daemon running).

Fallback rule: the chain moves to the next backend only when the failed one sent no input
(`input_sent` False); otherwise a retry could make the text arrive twice. When everything fails,
the text is put on the clipboard and the result is ok=False with every reason.

Focus rule (`focus.FocusGuard`, checked before the first backend): when one of our own windows or
no window has the keyboard focus, nothing is sent; the text goes on the clipboard and the result
is ok=False with `held_back` saying which. A clipboard-only chain (backend "clipboard") skips the
check: it sends nothing to any window.

Hold rule (`hold.KeyHold`, before the focus check): while a hotkey of ours is held, keys we send are
swallowed by the x11 backend's grab or combined with the chord's keys, so the chain waits for its
release (deliveries stay one by one, in order) and then sends. A press that came during the send
and took our keys (x11) gets the paste sent again after its release; typed text then stays on the
clipboard (`held_back`), as it does when a hold outlasts `hold.MAX_WAIT_S`.

Plans (`perform`, voice commands: `steps.Plan`): text steps go through the backends as above, keys
(Enter, Tab, the Backspaces of "scratch that") through the first backend whose tool sends keys here;
the hold and focus rules run once before the first step, a failed step ends the plan, and every
delivery is noted in `undo.UndoLog`, which says whether "scratch that" may take the last one back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from dictation.output.base import (
    Availability,
    DeliveryResult,
    InjectionError,
    OutputBackend,
    OutputOptions,
    RestoreOutcome,
)
from dictation.output.clipboard import platform_clipboard
from dictation.output.environment import Session, detect_session
from dictation.output.focus import FocusGuard
from dictation.output.hold import HELD_TOO_LONG, PASTE_TAKEN, TYPING_TAKEN, KeyHold, Mark
from dictation.output.keys import PynputKeys, WtypeKeys, XdotoolKeys, YdotoolKeys
from dictation.output.paste import (
    ON_CLIPBOARD,
    ClipboardKeeper,
    ClipboardOnlyBackend,
    ClipboardPasteBackend,
)
from dictation.output.process import Host, SystemHost
from dictation.output.steps import Keys, Step, Undo
from dictation.output.typing_backend import TypingBackend
from dictation.output.undo import AFTER_KEY, HALF_SENT, UndoLog
from dictation.output.windows import WindowInfo
from dictation.textclean import strip_controls

log = logging.getLogger(__name__)
# A key right after a paste waits this long: GTK and browsers paste asynchronously, and an Enter
# arriving first would send a chat message without the text. Text after a key waits as long: the
# window acts on the key first (a chat sends and clears its field; wtype's next keymap settles).
KEY_AFTER_PASTE_S = 0.2

_SENDERS = {"xdotool": XdotoolKeys, "wtype": WtypeKeys, "ydotool": YdotoolKeys, "pynput": PynputKeys}
TOOLS = tuple(_SENDERS)
BACKEND_NAMES = tuple(f"{tool}-{mode}" for tool in _SENDERS for mode in ("paste", "type")) + ("clipboard",)
AUTO_ORDER = {
    "x11": ("xdotool-paste", "xdotool-type", "pynput-type"),
    "wayland": ("wtype-paste", "ydotool-paste", "wtype-type", "ydotool-type"),
    "macos": ("pynput-paste", "pynput-type"),
    "windows": ("pynput-paste", "pynput-type"),
    "none": ("xdotool-paste", "xdotool-type"),
}


@dataclass(frozen=True)
class BackendStatus:
    name: str
    ok: bool
    reason: str
    unicode: str  # "yes" or "no": whether non-ASCII text arrives intact through this backend


class OutputChain:
    """An OutputBackend that tries its backends in order. Deliveries are serialised."""

    def __init__(
        self,
        name: str,
        backends: list[OutputBackend],
        fallback: OutputBackend | None,
        session: Session,
        keeper: ClipboardKeeper,
        guard: FocusGuard | None = None,
        hold: KeyHold | None = None,
    ):
        self.name, self.backends, self.fallback = name, backends, fallback
        self.session, self.keeper = session, keeper
        self.guard = guard
        self.hold = hold
        self._lock = threading.Lock()
        self._sending: tuple[KeyHold | None, Mark | None] = (None, None)  # _deliver_one's hold, its mark
        self.undo = UndoLog()  # what "scratch that" may take back (output/undo.py)
        self._window: WindowInfo | None = None  # the focused window before the last text was sent
        if hold is not None:
            for backend in backends:
                if hasattr(backend, "before_keys"):
                    backend.before_keys = self._before_keys

    def is_available(self) -> Availability:
        reasons = []
        for backend in self.backends:
            available = backend.is_available()
            if available:
                return Availability(True, f"{backend.name}: {available.reason}")
            reasons.append(f"{backend.name}: {available.reason}")
        return Availability(False, "; ".join(reasons) or "no backend")

    def deliver(self, text: str) -> DeliveryResult:
        text = strip_controls(text)  # never typed as keystrokes a terminal acts on (dictation/textclean.py)
        with self._lock:
            self._window = None
            result = self._deliver(text)
            self._note_typed(text, result)
            return result

    def _note_typed(self, text: str, result: DeliveryResult) -> None:
        if result.ok and text:
            self.undo.typed(text, self._window)
        elif result.input_sent:
            self.undo.clear(HALF_SENT)

    def perform(self, steps: list[Step] | tuple[Step, ...]) -> DeliveryResult:
        """Run a dictation's steps in order (`steps.Plan`): text, key presses, "scratch that". The hold
        and focus rules apply once, before the first step; a step that fails ends the plan."""
        steps = [s for s in (strip_controls(s) if isinstance(s, str) else s for s in steps) if s != ""]
        if all(isinstance(s, str) for s in steps):
            return self.deliver("".join(steps))
        text = "".join(s for s in steps if isinstance(s, str))
        with self._lock:
            hold = self.hold if any(self._hazard(b) for b in self.backends) else None
            if hold is not None and not hold.wait()[1]:
                return self._refuse_plan(text, HELD_TOO_LONG, f"held: {', '.join(sorted(hold.held))}")
            window = None
            if self.guard is not None and self.fallback is not None:
                focus = self.guard.check()
                if focus.held_back is not None:
                    return self._refuse_plan(text, focus.held_back, focus.detail)
                window = focus.window
            return self._perform(steps, hold, window)

    def _perform(self, steps: list[Step], hold: KeyHold | None, window: WindowInfo | None) -> DeliveryResult:
        results: list[DeliveryResult] = []
        undone, refused, pasted, after_key = 0, None, False, False
        for step in steps:
            if isinstance(step, Undo):
                chars, why = self.undo.check(window)
                if why is not None:
                    log.warning("scratch that: not performed: %s", why)
                    refused = why
                    continue
                result = self._press(Keys("backspace", chars), hold, pasted)
                if result.ok:
                    self.undo.undone()
                    undone += chars
            elif isinstance(step, Keys):
                result = self._press(step, hold, pasted)
                self.undo.clear(AFTER_KEY if result.ok else HALF_SENT)
            else:
                if after_key:
                    time.sleep(KEY_AFTER_PASTE_S)
                result = self._try_backends(step, hold)
                self._window = window
                self._note_typed(step, result)
            results.append(result)
            after_key = isinstance(step, (Keys, Undo))
            pasted = isinstance(step, str) and result.ok and result.chord is not None
            if not result.ok:
                break
        last = results[-1] if results else DeliveryResult(self.name, refused is None, "nothing to do")
        return replace(
            last,
            ok=all(r.ok for r in results) and bool(results),
            message="; ".join(r.message for r in results) or last.message,
            on_clipboard=any(r.on_clipboard for r in results),
            input_sent=any(r.input_sent for r in results),
            restore=next((r.restore for r in reversed(results) if r.restore is not None), None),
            undone=undone,
            undo_refused=refused,
        )

    def _press(self, step: Keys, hold: KeyHold | None, after_paste: bool) -> DeliveryResult:
        """Press a key with the first backend whose tool can send keys here."""
        reasons = []
        for backend in self.backends:
            sender = getattr(backend, "keys", None)
            available = sender.check() if sender is not None else None
            if not available:
                reasons.append(f"{backend.name}: {available.reason if available is not None else 'sends no keys'}")
                continue
            if hold is not None and self._hazard(backend):
                hold.wait()
            if after_paste:
                time.sleep(KEY_AFTER_PASTE_S)
            what = step.key if step.count == 1 else f"{step.key} {step.count} times"
            try:
                sender.press_key(step.key, step.count)
            except InjectionError as exc:
                return DeliveryResult(backend.name, False, f"pressing {what}: {exc}", input_sent=exc.input_sent)
            log.info("pressed %s with %s", what, sender.name)
            return DeliveryResult(backend.name, True, f"pressed {what}", input_sent=True)
        return DeliveryResult(self.name, False, f"no tool can press {step.key} here: {'; '.join(reasons) or 'none'}")

    def _refuse_plan(self, text: str, why: str, detail: str) -> DeliveryResult:
        """Nothing sent: the plan's text (if any) goes on the clipboard; keys and "scratch that" are dropped."""
        if text:
            return self._hold_back(text, why, detail)
        log.warning("keys not sent: %s (%s)", why, detail)
        return DeliveryResult(self.name, False, f"not delivered: {why}", held_back=why)

    def _deliver(self, text: str) -> DeliveryResult:
        hold = self.hold if text and any(self._hazard(b) for b in self.backends) else None
        waited = 0.0
        if hold is not None:
            waited, released = hold.wait()
            if waited:
                log.info("waited %.2f s for the hotkey's release before sending the text", waited)
            if not released:
                return self._hold_back(text, HELD_TOO_LONG, f"held: {', '.join(sorted(hold.held))}")
        result = self._send(text, hold)
        return replace(result, waited_s=waited) if waited else result

    def _hazard(self, backend: OutputBackend) -> str | None:
        return self.hold.hazard(backend.name) if self.hold is not None else None

    def _send(self, text: str, hold: KeyHold | None) -> DeliveryResult:
        if self.guard is not None and text and self.fallback is not None:
            focus = self.guard.check()
            if focus.held_back is not None:
                return self._hold_back(text, focus.held_back, focus.detail)
            self._window = focus.window
        return self._try_backends(text, hold)

    def _try_backends(self, text: str, hold: KeyHold | None) -> DeliveryResult:
        failures: list[str] = []
        on_clipboard = input_sent = False
        last: DeliveryResult | None = None
        for backend in self.backends:
            available = backend.is_available()
            if not available:
                failures.append(f"{backend.name}: {available.reason}")
                continue
            last = self._deliver_one(backend, text, hold)
            if last.held_back:
                return last
            if last.ok:
                if failures:
                    log.info("delivered with %s after: %s", backend.name, "; ".join(failures))
                return last
            failures.append(f"{backend.name}: {last.message.removesuffix('; ' + ON_CLIPBOARD)}")
            on_clipboard, input_sent = on_clipboard or last.on_clipboard, input_sent or last.input_sent
            if last.input_sent:
                break  # part of the text may be in the window already: no second attempt
        if not on_clipboard and self.fallback is not None:
            kept = self.fallback.deliver(text)
            on_clipboard = kept.ok
            if not kept.ok:
                failures.append(f"{self.fallback.name}: {kept.message}")
        reasons = "; ".join(failures) or "no backend configured"
        tail = f"{ON_CLIPBOARD}, paste it yourself" if on_clipboard else "the text is only in history"
        log.warning("output failed (%s); %s", reasons, tail)
        method = last.method if last is not None else (self.fallback.name if self.fallback else self.name)
        return DeliveryResult(
            method,
            False,
            f"not delivered: {reasons}; {tail}",
            on_clipboard=on_clipboard,
            input_sent=input_sent,
            chord=last.chord if last else None,
            window_class=last.window_class if last else None,
        )

    def _deliver_one(self, backend: OutputBackend, text: str, hold: KeyHold | None) -> DeliveryResult:
        """One backend's delivery; if a hotkey press came while it sent and its grab took our keys, a
        paste is sent again after the release (nothing of it arrived), typed text is kept aside."""
        for _attempt in range(3):
            sending = hold if hold is not None and self._hazard(backend) else None
            self._sending = (sending, sending.mark() if sending is not None else None)
            try:
                result = backend.deliver(text)
            finally:
                mark, self._sending = self._sending[1], (None, None)
            if mark is None or not (result.ok or result.input_sent) or not hold.interrupted(mark):
                return result
            hold.wait()
            if not hold.swallowed(mark):
                return result  # the keys went out before the press: they arrived
            if not isinstance(backend, ClipboardPasteBackend):
                return self._hold_back(text, TYPING_TAKEN, backend.name, input_sent=True)
            log.warning("a hotkey press took the paste's keys; pasting again after its release")
        return self._hold_back(text, PASTE_TAKEN, backend.name)

    def _before_keys(self) -> None:
        """Called by the backend right before its keys go out, after its focus probe and clipboard
        work (a paste spends 0.1-0.3 s there): a chord pressed meanwhile is waited out too, and the
        mark is taken now, so `interrupted` speaks of the keys alone."""
        hold = self._sending[0]
        if hold is not None:
            hold.wait()
            self._sending = (hold, hold.mark())

    def _hold_back(self, text: str, why: str, detail: str, *, input_sent: bool = False) -> DeliveryResult:
        """Send nothing; leave the text on the clipboard for the user to paste where it belongs."""
        kept = self.fallback.deliver(text)
        tail = f"{ON_CLIPBOARD}, paste it yourself" if kept.ok else f"the text is only in history ({kept.message})"
        log.warning("text not sent: %s (%s); %s", why, detail, tail)
        message = f"not delivered: {why}; {tail}"
        return DeliveryResult(
            self.fallback.name, False, message, on_clipboard=kept.ok, input_sent=input_sent, held_back=why
        )

    def flush(self) -> RestoreOutcome | None:
        """Call on quit: put the user's clipboard back now if a restore is pending, and undo
        temporary keymap bindings. Returns the restore's outcome (None if none was pending)."""
        with self._lock:
            for backend in self.backends:
                flush = getattr(backend, "flush", None)
                if flush is not None:
                    flush()
            return self.keeper.flush()

    def statuses(self) -> list[BackendStatus]:
        members = self.backends + ([self.fallback] if self.fallback is not None else [])
        return [_status(b) for b in members]

    def describe(self) -> str:
        """Human-readable diagnostics: the session, then each backend with why it is (not) usable."""
        lines = [f"output: {self.session.describe()}; backend {self.name}"]
        for i, status in enumerate(self.statuses(), 1):
            label = "fallback" if self.fallback is not None and i == len(self.backends) + 1 else f"{i}."
            state = "available" if status.ok else "unavailable"
            lines.append(f"  {label} {status.name}: {state}, {status.reason} [Unicode: {status.unicode}]")
        return "\n".join(lines)


def _status(backend: OutputBackend) -> BackendStatus:
    available = backend.is_available()
    return BackendStatus(backend.name, available.ok, available.reason, getattr(backend, "unicode", "?"))


def _build(name: str, session: Session, host: Host, options: OutputOptions, keeper: ClipboardKeeper, forced: bool):
    if name == "clipboard":
        return ClipboardOnlyBackend(keeper)
    tool, mode = name.split("-")
    keys = _SENDERS[tool](host, session, forced=forced, timeout=options.command_timeout_s)
    if mode == "paste":
        return ClipboardPasteBackend(name, keeper, keys, session, host, options)
    return TypingBackend(name, keys, options)


def _context(options, environment, platform, host):
    options = OutputOptions.coerce(options)
    env = os.environ if environment is None else environment
    session = detect_session(env, platform)
    host = host if host is not None else SystemHost(env)
    keeper = ClipboardKeeper(platform_clipboard(session, host, options.command_timeout_s), options)
    return options, session, host, keeper


def plan_backends(session_kind: str, backend: str = "auto", method: str = "auto") -> tuple[tuple[str, ...], bool]:
    """The backend names to try, in order, and whether they are forced (skip the session heuristics).

    See the table in the module docstring. Raises ValueError for an unknown backend or method.
    """
    if method not in ("auto", "paste", "type"):
        raise ValueError(f"unknown output method {method!r}; known: auto, paste, type")
    if backend in BACKEND_NAMES:
        return (backend,), True
    wanted = ("paste", "type") if method == "auto" else (method,)
    auto = AUTO_ORDER[session_kind]
    if backend == "auto":
        return tuple(n for n in auto if n.rsplit("-", 1)[1] in wanted), False
    if backend in TOOLS:
        names = tuple(n for n in auto if n.startswith(f"{backend}-") and n.rsplit("-", 1)[1] in wanted)
        return names or tuple(f"{backend}-{mode}" for mode in wanted), True
    raise ValueError(f"unknown output backend {backend!r}; known: auto, {', '.join(TOOLS)}, {', '.join(BACKEND_NAMES)}")


def choose_backend(
    options: object | None = None,
    environment: Mapping[str, str] | None = None,
    *,
    platform: str | None = None,
    host: Host | None = None,
    own_window: Callable[[], str | None] | None = None,
    hold: KeyHold | None = None,
) -> OutputChain:
    """The output path for this session, as one OutputBackend (an OutputChain).

    `options`: OutputOptions, a settings object with the same attribute names, or None.
    `environment`: defaults to os.environ; `platform` to sys.platform; `host` runs the tools.
    `own_window`: the app's answer to "which of our windows has the focus?" (see `focus.FocusGuard`).
    `hold`: which hotkeys of ours are held; keys wait for their release (see `hold.KeyHold`).
    """
    options, session, host, keeper = _context(options, environment, platform, host)
    names, forced = plan_backends(session.kind, options.backend, options.method)
    backends = [_build(n, session, host, options, keeper, forced) for n in names]
    fallback = None if names == ("clipboard",) else ClipboardOnlyBackend(keeper)
    label = (
        options.backend
        if options.method == "auto" or names == (options.backend,)
        else f"{options.backend}, {options.method} only"
    )
    guard = FocusGuard(session, host, own_window=own_window, timeout=options.command_timeout_s)
    chain = OutputChain(label, backends, fallback, session, keeper, guard, hold)
    log.info("%s", chain.describe())
    return chain


def diagnose(
    options: object | None = None,
    environment: Mapping[str, str] | None = None,
    *,
    platform: str | None = None,
    host: Host | None = None,
) -> list[BackendStatus]:
    """Every known backend with whether it works in this session and why (auto order first)."""
    options, session, host, keeper = _context(options, environment, platform, host)
    auto = AUTO_ORDER[session.kind]
    names = list(auto) + [n for n in BACKEND_NAMES if n not in auto]
    return [_status(_build(n, session, host, options, keeper, False)) for n in names]


def available_backends(
    options: object | None = None,
    environment: Mapping[str, str] | None = None,
    *,
    platform: str | None = None,
    host: Host | None = None,
) -> list[str]:
    """Names of the backends that work in this session, best first (see `diagnose` for the why)."""
    return [s.name for s in diagnose(options, environment, platform=platform, host=host) if s.ok]
