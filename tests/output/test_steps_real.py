"""Voice commands' keys in real windows: Enter, Tab and the Backspaces of "scratch that", sent by the real
tools (xdotool on Xvfb, wtype on a headless sway) into a Qt text field that reports what it holds."""

from __future__ import annotations

import pytest

from dictation.output.steps import Keys, Undo
from dictation.output.undo import AFTER_KEY, MOVED


@pytest.mark.parametrize("backend", ["xdotool-type", "xdotool-paste"])
def test_x11_enter_and_tab_are_pressed_between_the_texts(target, output, backend):
    out = output(backend)
    result = out.perform(["Dear Anna,", Keys("enter"), "one", Keys("tab"), "two"])
    assert result.ok, result.message
    assert target.wait_for_text("Dear Anna,\none\ttwo") == "Dear Anna,\none\ttwo"


@pytest.mark.parametrize("backend", ["xdotool-type", "xdotool-paste"])
def test_x11_scratch_that_removes_exactly_the_previous_dictation(target, output, backend):
    out = output(backend)
    assert out.deliver("Keep this. ").ok
    assert out.deliver("Grüße 你好, naïve! ").ok
    assert target.wait_for_text("Keep this. Grüße 你好, naïve! ") == "Keep this. Grüße 你好, naïve! "

    result = out.perform([Undo()])

    assert (result.ok, result.undone) == (True, len("Grüße 你好, naïve! ")), result.message
    assert target.wait_for_text("Keep this. ") == "Keep this. "  # characters, not bytes: nothing more went
    result = out.perform([Undo(), "Replaced."])
    assert (result.ok, result.undone) == (True, len("Keep this. "))
    assert target.wait_for_text("Replaced.") == "Replaced."


def test_x11_scratch_that_is_not_performed_in_another_window(xvfb, target, output, tmp_path):
    """The text went to one window; the focus is now on another one: nothing is removed there."""
    from tests.output.conftest import Target, wait_until

    out = output("xdotool-type")
    assert out.deliver("first window ").ok
    assert target.wait_for_text("first window ") == "first window "
    other = Target(xvfb, tmp_path / "other.txt")  # a new window takes the focus when it shows
    try:
        wait_until(lambda: not target.focused(), 10, what="the focus to move to the other window")
        result = out.perform([Undo()])
        assert (result.ok, result.undone, result.undo_refused) == (False, 0, MOVED), result.message
        assert other.wait_for_text("") == "" and target.text() == "first window "
    finally:
        other.close()


def test_wayland_enter_and_scratch_that_with_wtype(sway, wl_target, output):
    out = output("wtype-type", env=sway)
    assert out.perform(["Send it.", Keys("enter"), "Grüße "]).ok
    assert wl_target.wait_for_text("Send it.\nGrüße ") == "Send it.\nGrüße "
    result = out.perform([Undo()])  # the text after the Enter
    assert (result.ok, result.undone) == (True, 6), result.message
    assert wl_target.wait_for_text("Send it.\n") == "Send it.\n"
    result = out.perform([Undo()])  # before it was an Enter: refused, nothing sent
    assert (result.undone, result.undo_refused) == (0, AFTER_KEY)
    assert out.deliver("你好 ").ok
    assert wl_target.wait_for_text("Send it.\n你好 ") == "Send it.\n你好 "
    assert out.perform([Undo()]).undone == 3
    assert wl_target.wait_for_text("Send it.\n") == "Send it.\n"
