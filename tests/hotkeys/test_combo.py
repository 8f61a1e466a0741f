"""ComboTracker: when a binding is pressed and released, as tables of key steps."""

from __future__ import annotations

import pytest

from dictation.hotkeys import ComboTracker, parse_hotkey

BINDINGS = {
    "dictate": "ctrl+alt+space",
    "ptt": "F9",
    "rptt": "right_ctrl",
    "cancel": "esc",
    "mods": "ctrl+shift",
    "sided": "left_alt+d",
}


def run(steps, bindings=BINDINGS):
    """steps: '+key' presses, '-key' releases; returns every (binding, pressed) event in order."""
    tracker = ComboTracker({name: parse_hotkey(text) for name, text in bindings.items()})
    events = []
    for step in steps.split():
        key = step[1:]
        events += tracker.press(key) if step[0] == "+" else tracker.release(key)
    return events, tracker


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # push-to-talk key, with auto-repeat: one press, one release
        ("+f9 +f9 +f9 +f9 -f9", [("ptt", True), ("ptt", False)]),
        # combo: main key last; released by the first key going up, main key or modifier
        ("+left_ctrl +left_alt +space -space -left_alt -left_ctrl", [("dictate", True), ("dictate", False)]),
        ("+left_ctrl +left_alt +space -left_ctrl -space -left_alt", [("dictate", True), ("dictate", False)]),
        # generic modifiers match either side (right ctrl alone is also the "rptt" binding)
        (
            "+right_ctrl +right_alt +space +space -right_alt -space -right_ctrl",
            [("rptt", True), ("dictate", True), ("dictate", False), ("rptt", False)],
        ),
        # main key pressed before the modifiers (typing, then ctrl+alt) does not fire
        ("+space +left_ctrl +left_alt -space -left_alt -left_ctrl", []),
        # an extra modifier makes it a different shortcut
        ("+left_shift +f9 -f9 -left_shift", []),
        ("+left_ctrl +left_alt +left_shift +space -space", []),
        # missing modifier
        ("+left_ctrl +space -space -left_ctrl", []),
        # re-press of the main key while modifiers stay down fires again
        ("+left_ctrl +left_alt +space -space +space -space", [("dictate", True), ("dictate", False)] * 2),
        # a lone right ctrl is push-to-talk; left ctrl is not
        ("+left_ctrl -left_ctrl +right_ctrl +right_ctrl -right_ctrl", [("rptt", True), ("rptt", False)]),
        # modifier-only combo fires in any order, released when either goes up
        ("+left_shift +right_ctrl -left_shift -right_ctrl", [("mods", True), ("mods", False)]),
        # (right ctrl alone fired rptt first; adding shift then fires "ctrl+shift")
        (
            "+right_ctrl +left_shift -left_shift -right_ctrl",
            [("rptt", True), ("mods", True), ("mods", False), ("rptt", False)],
        ),
        # cancel while push-to-talk or the combo is held: the held binding's modifiers don't block it
        ("+f9 +esc -esc -f9", [("ptt", True), ("cancel", True), ("cancel", False), ("ptt", False)]),
        (
            "+left_ctrl +left_alt +space +esc -esc -space -left_alt -left_ctrl",
            [("dictate", True), ("cancel", True), ("cancel", False), ("dictate", False)],
        ),
        # ...but modifiers nobody holds for a binding still do
        ("+left_ctrl +esc -esc -left_ctrl", []),
        # sided modifier: only the left one
        ("+right_alt +d -d -right_alt +left_alt +d -d -left_alt", [("sided", True), ("sided", False)]),
        # releases of keys we never saw go down (held before we started) are ignored
        ("-f9 -left_ctrl +f9 -f9", [("ptt", True), ("ptt", False)]),
        # unrelated typing
        ("+h +e +l -h -e -l +space -space", []),
    ],
)
def test_combo_table(steps, expected):
    events, _ = run(steps)
    assert events == expected


def test_repeats_are_counted_and_release_all_frees_everything():
    events, tracker = run("+left_ctrl +left_alt +space +space +space")
    assert events == [("dictate", True)]
    assert tracker.repeats_suppressed == 2
    assert tracker.active == ("dictate",)
    assert tracker.release_all() == [("dictate", False)]
    assert tracker.held == frozenset() and tracker.active == ()


def test_two_bindings_on_the_same_key_both_fire():
    events, _ = run("+f9 -f9", {"a": "F9", "b": "f9"})
    assert events == [("a", True), ("b", True), ("a", False), ("b", False)]
