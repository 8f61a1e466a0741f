"""Clipboard + paste chord, with the user's clipboard put back afterwards.

Order of one paste (ClipboardPasteBackend.deliver):
1. Probe the focused window and choose the chord (see `windows.choose_chord`).
2. Save what the clipboard holds now (a snapshot: text, one non-text format, or "empty"). If a restore
   from the previous dictation is still pending, it is cancelled and *its* snapshot (the user's
   content, not our previous text) is carried over, so back-to-back dictations never lose it.
3. Put the text on the clipboard (and on PRIMARY for Shift+Insert) and read it back: the chord is
   only sent once the clipboard verifiably holds the text (Handy#502 pasted the old clipboard).
4. Send the chord. If that fails, the text stays on the clipboard and the result says so.
5. After `restore_delay_ms` (default 1000 ms, VoiceInk#415/#722), on a timer thread: if the
   clipboard still holds our text, put the snapshot back; if the user copied something else
   meanwhile, leave it alone. An "empty" snapshot clears the clipboard again.

Non-text previous content (an image): saved as one format (image/png first) and restored as that
format. Content that cannot be saved (xsel cannot see images; over 64 MiB; unreadable) is not
overwritten: the paste backend declines (ok=False, nothing sent) and the chain moves on to typing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dictation.output.base import (
    Availability,
    ClipboardError,
    DeliveryResult,
    InjectionError,
    OutputOptions,
    RestoreOutcome,
)
from dictation.output.clipboard import Clipboard, ClipboardSnapshot, Selection
from dictation.output.environment import Session
from dictation.output.keys import KeySender
from dictation.output.process import Host
from dictation.output.windows import choose_chord, focused_window

log = logging.getLogger(__name__)
ON_CLIPBOARD = "the text is on the clipboard"
VERIFY_TIMEOUT_S = 2.0


class ClipboardRestore:
    """A scheduled put-back of saved clipboard content. Runs on a daemon timer thread; `wait()`
    returns its outcome, `cancel()` drops it, `run_now()` does it at once (e.g. on quit)."""

    def __init__(self, keeper: ClipboardKeeper, text: str, saved: dict[Selection, ClipboardSnapshot], delay_s: float):
        self.text = text
        self.saved = saved
        self._keeper = keeper
        self._state = "new"
        self._outcome: RestoreOutcome | None = None
        self._done = threading.Event()
        self._timer = threading.Timer(delay_s, self.run_now)
        self._timer.daemon = True

    @property
    def pending(self) -> bool:
        return self._state in ("new", "pending")

    @property
    def outcome(self) -> RestoreOutcome | None:
        return self._outcome

    def start(self) -> None:
        with self._keeper.lock:
            if self._state == "new":
                self._state = "pending"
                self._timer.start()

    def wait(self, timeout: float | None = None) -> RestoreOutcome | None:
        self._done.wait(timeout)
        return self._outcome

    def cancel(self) -> bool:
        """Drop the restore if it has not run; True if it was still pending."""
        with self._keeper.lock:
            if not self.pending:
                return False
            self._timer.cancel()
            self._finish("cancelled", RestoreOutcome(False, "cancelled"))
            return True

    def run_now(self) -> RestoreOutcome | None:
        # The keeper's lock orders this against deliveries: a delivery that cancels us first wins.
        with self._keeper.lock:
            if not self.pending:
                return self._outcome
            self._timer.cancel()
            self._finish("done", self._keeper.restore(self.text, self.saved))
            return self._outcome

    def _finish(self, state: str, outcome: RestoreOutcome) -> None:
        self._state = state
        self._outcome = outcome
        self._done.set()


class ClipboardKeeper:
    """Owns one clipboard for all backends that use it: the lock, the pending restore, snapshots."""

    def __init__(self, clipboard: Clipboard, options: OutputOptions):
        self.clipboard = clipboard
        self.options = options
        self.lock = threading.RLock()
        self.verify_timeout_s = VERIFY_TIMEOUT_S
        self._pending: ClipboardRestore | None = None

    def take_over(self, selections: list[Selection]) -> dict[Selection, ClipboardSnapshot]:
        """Snapshots of what the user has in `selections` (nothing if restoring is off)."""
        with self.lock:
            carried: dict[Selection, ClipboardSnapshot] = {}
            previous = self._pending
            self._pending = None
            if previous is not None and previous.cancel():
                for sel, snap in previous.saved.items():
                    if self._holds(sel, previous.text):
                        carried[sel] = snap
            if not self.options.restore_clipboard:
                return {}
            return {sel: carried.get(sel) or self.clipboard.snapshot(sel) for sel in selections}

    def put(self, text: str, selections: list[Selection]) -> None:
        """Set the text and verify it by reading it back; raises ClipboardError.

        Polled: xclip's parent exits before the X server has processed the ownership change of
        its forked child, so an immediate read can still return the previous content."""
        with self.lock:
            for sel in selections:
                self.clipboard.write_text(text, sel)
                deadline = time.monotonic() + self.verify_timeout_s
                while not self._holds(sel, text):
                    if time.monotonic() > deadline:
                        raise ClipboardError(f"the {sel.value} did not take the text (read back something else)")
                    time.sleep(0.02)

    def schedule_restore(self, text: str, saved: dict[Selection, ClipboardSnapshot]) -> ClipboardRestore | None:
        if not saved:
            return None
        with self.lock:
            restore = ClipboardRestore(self, text, saved, self.options.restore_delay_ms / 1000)
            self._pending = restore
            restore.start()
            return restore

    def flush(self) -> RestoreOutcome | None:
        """Run a pending restore now (call on quit, so the dictated text does not outlive the app)."""
        with self.lock:
            pending, self._pending = self._pending, None
        return pending.run_now() if pending is not None else None

    def restore(self, text: str, saved: dict[Selection, ClipboardSnapshot]) -> RestoreOutcome:
        with self.lock:
            if self._pending is not None and self._pending.text == text and self._pending.saved is saved:
                self._pending = None
            notes, restored = [], False
            for sel, snap in saved.items():
                if not self._holds(sel, text):
                    notes.append(f"{sel.value} changed since the paste, left alone")
                    continue
                if snap.kind == "unsaved":
                    notes.append(f"{sel.value}: previous content was not saved ({snap.note}), text left there")
                    continue
                try:
                    self.clipboard.restore(snap, sel)
                except ClipboardError as exc:
                    notes.append(f"{sel.value}: restore failed: {exc}")
                    log.warning("clipboard restore failed: %s", exc)
                    continue
                if not self._settles(sel, snap):
                    notes.append(f"{sel.value}: restore of {snap.describe()} not confirmed by reading back")
                    continue
                notes.append(f"{sel.value}: restored {snap.describe()}")
                restored = restored or sel is Selection.CLIPBOARD
            return RestoreOutcome(restored, "; ".join(notes))

    def cancel_pending(self) -> None:
        with self.lock:
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None

    def _settles(self, sel: Selection, snap: ClipboardSnapshot) -> bool:
        """Poll until reading back shows the restored content (text equal; no text for the rest)."""
        expected = {snap.text} if snap.kind == "text" else {None, ""}
        deadline = time.monotonic() + self.verify_timeout_s
        while True:
            try:
                if self.clipboard.read_text(sel) in expected:
                    return True
            except ClipboardError:
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def _holds(self, sel: Selection, text: str) -> bool:
        try:
            return self.clipboard.read_text(sel) == text
        except ClipboardError:
            return False


class ClipboardPasteBackend:
    """Set the clipboard, press the paste chord, put the user's clipboard back later. Unicode-safe:
    no keymap is involved, so any text the target can paste arrives intact."""

    unicode = "yes"
    before_keys: Callable[[], None] | None = None  # called right before the chord (OutputChain: hold.KeyHold)

    def __init__(
        self, name: str, keeper: ClipboardKeeper, keys: KeySender, session: Session, host: Host, options: OutputOptions
    ):
        self.name, self.keeper, self.keys = name, keeper, keys
        self.session, self.host, self.options = session, host, options

    def is_available(self) -> Availability:
        clip = self.keeper.clipboard.check()
        if not clip:
            return clip
        keys = self.keys.check()
        if not keys:
            return keys
        return Availability(True, f"{clip.reason}, keys via {keys.reason}")

    def deliver(self, text: str) -> DeliveryResult:
        if not text:
            return DeliveryResult(self.name, True, "nothing to paste")
        available = self.is_available()
        if not available:
            return DeliveryResult(self.name, False, available.reason)
        window = focused_window(self.session, self.host, timeout=self.options.command_timeout_s)
        chord, why = choose_chord(self.options.paste_chord, self.session, window, self.options.terminal_classes)
        selections = [Selection.CLIPBOARD]
        if chord.needs_primary and self.keeper.clipboard.supports_primary:
            selections.append(Selection.PRIMARY)
        fields = {"chord": chord, "window_class": window.label}

        with self.keeper.lock:
            try:
                saved = self.keeper.take_over(selections)
            except ClipboardError as exc:
                return DeliveryResult(self.name, False, f"reading the clipboard failed: {exc}", **fields)
            clip_snap = saved.get(Selection.CLIPBOARD)
            if clip_snap is not None and clip_snap.kind == "unsaved":
                msg = f"the clipboard holds content that cannot be saved ({clip_snap.note}); not overwriting it"
                return DeliveryResult(self.name, False, msg, **fields)
            try:
                self.keeper.put(text, selections)
            except ClipboardError as exc:
                return DeliveryResult(self.name, False, f"setting the clipboard failed: {exc}", **fields)
            if self.before_keys is not None:
                self.before_keys()
            try:
                self.keys.send_chord(chord)
            except InjectionError as exc:
                msg = f"{exc}; {ON_CLIPBOARD}"
                return DeliveryResult(self.name, False, msg, on_clipboard=True, input_sent=exc.input_sent, **fields)
            restore = self.keeper.schedule_restore(text, saved)
        log.info("pasted %d characters with %s (%s)", len(text), chord.value, why)
        return DeliveryResult(
            self.name, True, f"pasted with {chord.value} ({why})", on_clipboard=True, restore=restore, **fields
        )


class ClipboardOnlyBackend:
    """Only copy the text; the user pastes. As the chain's last resort its success is reported as a
    failure to deliver (nothing reached the window), with the text safe on the clipboard."""

    unicode = "yes"

    def __init__(self, keeper: ClipboardKeeper, name: str = "clipboard"):
        self.name, self.keeper = name, keeper

    def is_available(self) -> Availability:
        return self.keeper.clipboard.check()

    def deliver(self, text: str) -> DeliveryResult:
        available = self.is_available()
        if not available:
            return DeliveryResult(self.name, False, available.reason)
        with self.keeper.lock:
            self.keeper.cancel_pending()  # the user needs this text now, not the old clipboard
            try:
                self.keeper.put(text, [Selection.CLIPBOARD])
            except ClipboardError as exc:
                return DeliveryResult(self.name, False, f"setting the clipboard failed: {exc}")
        return DeliveryResult(self.name, True, "copied to the clipboard", on_clipboard=True)
