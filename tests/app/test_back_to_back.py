"""Dictating back to back through the controller: the next take's hotkey is held when
the previous take's text is ready. The real engine (tiny checkpoint), history and workers; the
output chain is the real `OutputChain` with keys that record what they sent, and what was held then."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from dictation.config import Outcome
from dictation.output import OutputOptions
from dictation.output.paste import ClipboardKeeper, ClipboardOnlyBackend
from dictation.output.select import OutputChain
from dictation.output.typing_backend import TypingBackend
from dictation.session import Status
from tests.app.rig import speech
from tests.output.fakes import FakeClipboard
from tests.output.test_hold import HeldKeys
from tests.output.test_paste_logic import SESSION


def test_a_text_ready_while_the_next_take_is_held_is_typed_after_the_release_in_order(rig):
    r = rig()
    hold = r.c._s.output_worker.hold  # the one the controller's hotkey input feeds
    keys = HeldKeys("xdotool", hold)
    keeper = ClipboardKeeper(FakeClipboard(), OutputOptions())
    options = OutputOptions()
    r.chain = OutputChain(
        "xdotool",
        [TypingBackend("xdotool-type", keys, options)],
        ClipboardOnlyBackend(keeper),
        SESSION,
        keeper,
        None,
        hold,
    )
    r.start()
    r.wait_status(Status.IDLE)

    r.dictate(speech(seed=5))  # take 1
    r.hold(speech(seed=6))  # take 2: the hotkey is down again before take 1's text is ready
    r.qtbot.waitUntil(lambda: hold.waiting == 1, timeout=30_000)  # take 1's text waits for the release
    assert keys.sent == [] and hold.held == {"dictate"}
    first = min(r.history.recent(2), key=lambda e: e.id)  # take 1's entry (take 2's exists too, pending)
    assert first.text and first.outcome == Outcome.PENDING  # stored, not typed: the history says it waits

    r.release(speech(seed=6))
    r.qtbot.waitUntil(lambda: len(keys.sent) == 2, timeout=30_000)
    entries = sorted(r.history.recent(2), key=lambda e: e.id)
    assert keys.sent == [f"type {e.text!r} None" for e in entries]  # in the order spoken, one by one
    assert keys.held_at_send == [frozenset(), frozenset()]  # none while the hotkey was down
    r.qtbot.waitUntil(lambda: all(r.history.get(e.id).outcome == Outcome.TYPED for e in entries), timeout=10_000)
