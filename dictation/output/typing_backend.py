"""Typing the text key by key (xdotool type, wtype, ydotool type, pynput).

Slower than pasting and at the mercy of the keyboard layout, but it leaves the clipboard alone and
works in apps that mangle pastes. Senders that cannot type a character reliably refuse the whole
text up front (nothing is sent), so the chain falls back instead of typing garbage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dictation.output.base import Availability, DeliveryResult, InjectionError, OutputOptions
from dictation.output.keys import KeySender

log = logging.getLogger(__name__)


class TypingBackend:
    before_keys: Callable[[], None] | None = None  # called right before the first key (OutputChain: hold.KeyHold)

    def __init__(self, name: str, keys: KeySender, options: OutputOptions):
        self.name, self.keys, self.options = name, keys, options

    @property
    def unicode(self) -> str:
        return "yes" if self.keys.unicode_typing else "no"

    def flush(self) -> None:
        """Undo temporary keyboard changes now (xdotool's bound keycodes); call on quit."""
        flush = getattr(self.keys, "flush", None)
        if flush is not None:
            flush()

    def is_available(self) -> Availability:
        available = self.keys.check()
        caveat = getattr(self.keys, "typing_caveat", lambda: "")()
        return Availability(True, f"{available.reason}; {caveat}") if available and caveat else available

    def deliver(self, text: str) -> DeliveryResult:
        if not text:
            return DeliveryResult(self.name, True, "nothing to type")
        available = self.is_available()
        if not available:
            return DeliveryResult(self.name, False, available.reason)
        if not self.keys.unicode_typing and not text.isascii():
            return DeliveryResult(self.name, False, f"{self.keys.name} cannot type non-ASCII characters here")
        if self.before_keys is not None:
            self.before_keys()
        try:
            self.keys.type_text(text, self.options.type_delay_ms)
        except InjectionError as exc:
            return DeliveryResult(self.name, False, str(exc), input_sent=exc.input_sent)
        log.info("typed %d characters with %s", len(text), self.keys.name)
        return DeliveryResult(self.name, True, f"typed with {self.keys.name}", input_sent=True)
