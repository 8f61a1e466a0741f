"""What the app records and says when text was not sent because of the focus, and what the
clipboard-only output records; the focus checks themselves are in tests/output/test_focus*.py."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from PySide6.QtWidgets import QWidget

from dictation.app.focus import OwnFocus
from dictation.app.history_window import outcome_label
from dictation.config import Outcome
from dictation.output import DeliveryResult, OutputOptions, choose_backend
from dictation.output.focus import NO_WINDOW, OWN_WINDOW
from dictation.output.process import ProcResult
from dictation.session import Status
from dictation.takes import outcome_of
from tests.app.rig import speech
from tests.output.fakes import FakeHost, FakeSelectionTools

KEPT_NO_WINDOW = "clipboard_only: not delivered: no window had the keyboard focus"


@pytest.mark.parametrize(
    "result, outcome",
    [
        (DeliveryResult("clipboard", False, "…", on_clipboard=True, held_back=NO_WINDOW), KEPT_NO_WINDOW),
        (
            DeliveryResult("clipboard", False, "…", on_clipboard=True, held_back=OWN_WINDOW),
            "clipboard_only: not delivered: a Dictation window had the keyboard focus",
        ),
        (
            DeliveryResult("clipboard", False, "not delivered: …; the text is only in history", held_back=NO_WINDOW),
            "failed: not delivered: …; the text is only in history",
        ),
        # the clipboard-only output sent nothing to a window: never "pasted"
        (DeliveryResult("clipboard", True, "copied to the clipboard", on_clipboard=True), Outcome.CLIPBOARD_ONLY),
        (DeliveryResult("xdotool-paste", True, "pasted with ctrl+v", on_clipboard=True), Outcome.PASTED),
        (DeliveryResult("wtype-type", True, "typed with wtype"), Outcome.TYPED),
        (DeliveryResult("xdotool-paste", False, "not delivered: …", on_clipboard=True), Outcome.CLIPBOARD_ONLY),
    ],
)
def test_history_outcome_says_what_happened_to_the_text(result, outcome):
    assert outcome_of(result) == outcome
    assert Outcome.is_valid(outcome)


def test_text_kept_on_the_clipboard_is_labelled_with_the_reason():
    assert outcome_label(KEPT_NO_WINDOW) == "On clipboard, not delivered: no window had the keyboard focus"
    assert outcome_label(Outcome.CLIPBOARD_ONLY) == "On clipboard"
    assert Outcome.kept("not delivered:\n  no window") == "clipboard_only: not delivered: no window"
    assert not Outcome.is_valid("clipboard_only: ") and not Outcome.is_valid("clipboard_onlyx")


def _no_focus_chain():
    """The real output chain of an X11 session whose X server says no window has the focus."""
    tools = FakeSelectionTools()
    no_focus = b"XGetInputFocus returned the focused window of 1. This is likely a bug in the X server.\n"

    def respond(argv, data):
        if argv[:2] == ("xdotool", "getwindowfocus"):
            return ProcResult(argv, 1, stderr=no_focus)
        return tools(argv, data)

    host = FakeHost({"xdotool", "xclip", "xsel", "xprop"}, responder=respond)
    env = {"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11"}
    chain = choose_backend(OutputOptions(backend="xdotool-paste"), env, host=host)
    return chain, host, tools


def test_a_dictation_with_no_focused_window_is_kept_and_recorded_truthfully(rig, qtbot):
    chain, host, tools = _no_focus_chain()
    r = rig(chain=chain)
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech())
    qtbot.waitUntil(
        lambda: bool(r.history.recent(1)) and r.history.recent(1)[0].outcome != Outcome.PENDING, timeout=20_000
    )

    entry = r.history.recent(1)[0]
    assert entry.text.strip() and entry.outcome == KEPT_NO_WINDOW  # was "pasted"
    assert tools.store["clipboard"][1] == entry.text.encode()  # waiting there to be pasted by hand
    assert not [argv for argv in host.argvs() if argv[0] == "xdotool" and "key" in argv]  # no Ctrl+V sent
    assert (
        "warning",
        "Not typed: no window had the keyboard focus. The text is on the clipboard: click where it belongs "
        "and paste it.",
    ) in r.notes


def test_the_app_guards_its_output_with_its_own_focus(rig):
    """The controller gives the output worker its view of our windows' focus before the chain is built."""
    r = rig()
    r.start()
    worker = r.c._s.output_worker
    assert isinstance(worker.own_window, OwnFocus)


def test_own_focus_ignores_platforms_without_a_desktop(qtbot):
    """Offscreen, every shown window counts as focused; that says nothing about the user's desktop."""
    window = QWidget()
    qtbot.addWidget(window)
    window.show()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    own = OwnFocus()
    assert not own.enabled and own() is None
