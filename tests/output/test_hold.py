"""Keys wait while a hotkey of ours is held, with an in-memory clipboard and keys that
record what the hold said at the moment they were sent. The real X server: test_hold_x11_real.py."""

from __future__ import annotations

import threading
import time

import pytest

from dictation.output import OutputOptions
from dictation.output.hold import (
    COMBINED,
    HELD_TOO_LONG,
    HOTKEY_BACKENDS,
    PASTE_TAKEN,
    SWALLOWED,
    TYPING_TAKEN,
    KeyHold,
    hazard,
)
from dictation.output.paste import ClipboardKeeper, ClipboardOnlyBackend, ClipboardPasteBackend
from dictation.output.select import BACKEND_NAMES, OutputChain
from dictation.output.typing_backend import TypingBackend
from dictation.takes import outcome_of
from tests.output.fakes import FakeClipboard, FakeHost, FakeKeys
from tests.output.test_paste_logic import SESSION
from tests.waiting import wait_until

SETTLE_S = 0.05


class HeldKeys(FakeKeys):
    """Records each send with the hotkeys held at that moment; ``during`` runs inside a send (a
    press that comes while the keys go out)."""

    def __init__(self, name, hold):
        super().__init__(name)
        self.hold = hold
        self.held_at_send: list[frozenset[str]] = []
        self.during = None

    def _record(self):
        self.held_at_send.append(self.hold.held)
        if self.during is not None:
            during, self.during = self.during, None
            during()

    def send_chord(self, chord):
        self._record()
        super().send_chord(chord)

    def type_text(self, text, delay_ms):
        self._record()
        super().type_text(text, delay_ms)


def chain_for(output_backend: str, hold: KeyHold):
    """The chain `choose_backend` builds for ``output_backend`` alone, with recording keys."""
    options = OutputOptions(restore_delay_ms=60_000)
    clipboard = FakeClipboard("user text")
    keeper = ClipboardKeeper(clipboard, options)
    keys = HeldKeys(output_backend.split("-")[0], hold)
    if output_backend == "clipboard":
        chain = OutputChain("clipboard", [ClipboardOnlyBackend(keeper)], None, SESSION, keeper, None, hold)
        return chain, keys, clipboard
    if output_backend.endswith("-paste"):
        backend = ClipboardPasteBackend(output_backend, keeper, keys, SESSION, FakeHost(), options)
    else:
        backend = TypingBackend(output_backend, keys, options)
    chain = OutputChain(output_backend, [backend], ClipboardOnlyBackend(keeper), SESSION, keeper, None, hold)
    return chain, keys, clipboard


class Deliveries:
    """The output worker: one thread, deliveries in the order they were queued."""

    def __init__(self, chain):
        self.chain, self.results, self._texts = chain, [], []
        self._thread = None

    def queue(self, *texts):
        self._texts += texts
        self._thread = threading.Thread(target=lambda: [self.results.append(self.chain.deliver(t)) for t in texts])
        self._thread.start()

    def join(self):
        self._thread.join(10)
        assert not self._thread.is_alive()
        return self.results


# Which held chord does what to which output tool: the table in dictation/output/hold.py.
TABLE = {
    "x11": {"xdotool": SWALLOWED, "pynput": SWALLOWED, "ydotool": SWALLOWED, "wtype": SWALLOWED, "clipboard": None},
    "evdev": {"xdotool": COMBINED, "pynput": COMBINED, "ydotool": COMBINED, "wtype": COMBINED, "clipboard": None},
    "pynput": {"xdotool": COMBINED, "pynput": COMBINED, "ydotool": COMBINED, "wtype": COMBINED, "clipboard": None},
    "portal": {"xdotool": COMBINED, "pynput": COMBINED, "ydotool": COMBINED, "wtype": COMBINED, "clipboard": None},
}


@pytest.mark.parametrize("output_backend", BACKEND_NAMES)
@pytest.mark.parametrize("hotkey_backend", HOTKEY_BACKENDS)
def test_every_hotkey_backend_and_typing_tool(hotkey_backend, output_backend):
    """A chord held while a text is ready: keys that would be swallowed (x11's grab) or combined with
    the chord's keys (the listeners) wait for the release, then go out once; the clipboard-only
    backend sends no keys and delivers at once."""
    expected = TABLE[hotkey_backend][output_backend.split("-")[0]]
    assert hazard(hotkey_backend, output_backend) == expected
    hold = KeyHold(settle_s=SETTLE_S)
    hold.backend = hotkey_backend
    chain, keys, clipboard = chain_for(output_backend, hold)
    hold.set("dictate", True)  # the next take's chord is down
    out = Deliveries(chain)
    out.queue("first take")
    if expected is None:
        result = out.join()[0]
        assert (result.ok, result.waited_s, clipboard.text()) == (True, 0.0, "first take")
        assert outcome_of(result) == "clipboard_only"
        return
    wait_until(lambda: hold.waiting == 1, 10, what="the delivery to wait for the release")
    assert keys.sent == []  # nothing goes out while the chord is held
    hold.set("dictate", False)
    result = out.join()[0]
    assert result.ok, result.message
    assert keys.held_at_send == [frozenset()]  # sent once, with nothing of ours held
    assert result.waited_s >= SETTLE_S  # and not before the chord's modifiers had a moment to go up
    assert outcome_of(result) == ("pasted" if output_backend.endswith("-paste") else "typed")


def test_texts_that_waited_go_out_in_order_one_paste_each():
    hold = KeyHold(settle_s=SETTLE_S)
    hold.backend = "x11"
    chain, keys, clipboard = chain_for("xdotool-paste", hold)
    hold.set("dictate", True)
    out = Deliveries(chain)
    out.queue("one. ", "two. ")
    wait_until(lambda: hold.waiting == 1, 10, what="the first delivery to wait")
    hold.set("cancel", True)  # Esc while the chord is held: still held after the chord's release
    hold.set("dictate", False)
    time.sleep(SETTLE_S * 3)  # past the settle time: the held Esc alone keeps them waiting
    assert keys.sent == []
    hold.set("cancel", False)
    results = out.join()
    assert [r.ok for r in results] == [True, True]
    assert keys.sent == ["shift+insert", "shift+insert"]  # two pastes, not one of both texts
    assert keys.held_at_send == [frozenset(), frozenset()]
    writes = [op for op in clipboard.ops if op.startswith("write clipboard")]
    assert writes == ["write clipboard 'one. '", "write clipboard 'two. '"]  # in order


def test_a_press_during_the_paste_that_took_its_keys_pastes_again_after_the_release():
    taken = [0]
    hold = KeyHold(settle_s=SETTLE_S)
    hold.backend, hold.taken = "x11", lambda: taken[0]
    chain, keys, _clipboard = chain_for("xdotool-paste", hold)

    def press_and_take():  # the chord went down just before our Shift+Insert reached the server
        hold.set("dictate", True)
        taken[0] += 2  # the grab took Shift and Insert
        threading.Timer(0.2, hold.set, ("dictate", False)).start()

    keys.during = press_and_take
    result = chain.deliver("words")
    assert result.ok and outcome_of(result) == "pasted"
    assert keys.sent == ["shift+insert", "shift+insert"]  # sent again, once the chord was released
    assert keys.held_at_send == [frozenset(), frozenset()]


def test_a_press_during_the_paste_that_took_nothing_is_a_paste():
    hold = KeyHold(settle_s=SETTLE_S)
    hold.backend, hold.taken = "x11", lambda: 0
    chain, keys, _clipboard = chain_for("xdotool-paste", hold)
    keys.during = lambda: (hold.set("dictate", True), threading.Timer(0.1, hold.set, ("dictate", False)).start())
    result = chain.deliver("words")
    assert result.ok and keys.sent == ["shift+insert"]  # the keys went out before the grab: no second paste


def test_typing_that_a_press_interrupted_is_left_on_the_clipboard():
    taken = [0]
    hold = KeyHold(settle_s=SETTLE_S)
    hold.backend, hold.taken = "x11", lambda: taken[0]
    chain, keys, clipboard = chain_for("xdotool-type", hold)

    def press_and_take():
        hold.set("dictate", True)
        taken[0] += 5
        hold.set("dictate", False)

    keys.during = press_and_take
    result = chain.deliver("typed words")
    assert (result.ok, result.held_back, result.on_clipboard) == (False, TYPING_TAKEN, True)
    assert len(keys.sent) == 1 and clipboard.text() == "typed words"  # not typed twice: part of it may be there
    assert outcome_of(result) == f"clipboard_only: not delivered: {TYPING_TAKEN}"


def test_a_paste_taken_every_time_ends_on_the_clipboard():
    taken = [0]
    hold = KeyHold(settle_s=0.0)
    hold.backend, hold.taken = "x11", lambda: taken[0]
    chain, keys, clipboard = chain_for("xdotool-paste", hold)

    class Always:
        def __call__(self):
            hold.set("dictate", True)
            taken[0] += 1
            hold.set("dictate", False)
            keys.during = self

    keys.during = Always()
    result = chain.deliver("words")
    assert (result.ok, result.held_back, clipboard.text()) == (False, PASTE_TAKEN, "words")
    assert len(keys.sent) == 3


def test_a_hold_that_never_ends_leaves_the_text_on_the_clipboard():
    hold = KeyHold(settle_s=SETTLE_S, limit_s=0.2)
    hold.backend = "evdev"
    chain, keys, clipboard = chain_for("xdotool-paste", hold)
    hold.set("dictate", True)  # its release was lost
    result = chain.deliver("words")
    assert (result.ok, result.held_back, keys.sent, clipboard.text()) == (False, HELD_TOO_LONG, [], "words")
    assert outcome_of(result) == f"clipboard_only: not delivered: {HELD_TOO_LONG}"


def test_the_hold_counts_presses_not_repeats_and_a_reset_lets_waiting_text_go():
    hold = KeyHold(settle_s=10.0)
    mark = hold.mark()
    hold.set("dictate", True)
    hold.set("dictate", True)  # auto-repeat
    assert hold.interrupted(mark) and hold.mark().presses == 1
    assert hold.held == {"dictate"}
    hold.set("cancel", False)  # a release of something not held changes nothing
    assert hold.held == {"dictate"}
    done = []
    waiter = threading.Thread(target=lambda: done.append(hold.wait()))
    waiter.start()
    wait_until(lambda: hold.waiting == 1, 10, what="the waiter")
    hold.reset()  # the backend stopped (quit, new hotkey settings): no release will come
    waiter.join(5)
    assert done and done[0][1] is True and hold.held == frozenset()


def test_a_press_while_the_paste_prepares_is_waited_out_before_the_keys():
    """A paste spends 0.1-0.3 s on the focus probe and the clipboard before its keys: a chord
    pressed then is waited out right before the keys, not sent into."""
    hold = KeyHold(settle_s=SETTLE_S)
    hold.backend, hold.taken = "x11", lambda: 0
    chain, keys, clipboard = chain_for("xdotool-paste", hold)
    write_text = clipboard.write_text

    def write_while_pressed(text, selection):
        write_text(text, selection)
        if not hold.held:
            hold.set("dictate", True)
            threading.Timer(0.2, hold.set, ("dictate", False)).start()

    clipboard.write_text = write_while_pressed
    result = chain.deliver("words")
    assert result.ok and keys.sent == ["shift+insert"]  # once: the press did not come during the keys
    assert keys.held_at_send == [frozenset()]
