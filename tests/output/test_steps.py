"""Voice commands through the output chain (output.steps, output.undo, OutputChain.perform) with fake
tools; tests/output/test_steps_real.py presses the keys into real windows."""

from __future__ import annotations

import pytest

from dictation.output import OutputOptions, TextOptions
from dictation.output.base import InjectionError
from dictation.output.environment import Session
from dictation.output.focus import NO_WINDOW, FocusGuard
from dictation.output.keys import WtypeKeys, XdotoolKeys, YdotoolKeys
from dictation.output.paste import ClipboardKeeper, ClipboardOnlyBackend, ClipboardPasteBackend
from dictation.output.process import ProcResult
from dictation.output.select import OutputChain
from dictation.output.steps import Keys, Plan, Undo, plan_for
from dictation.output.textops import Replacement
from dictation.output.typing_backend import TypingBackend
from dictation.output.undo import AFTER_KEY, HALF_SENT, MOVED, NO_WINDOW_ID, NOTHING
from dictation.spoken import Action
from tests.output.fakes import FakeClipboard, FakeHost, FakeKeys

X11 = Session("x11", display=":0")
GNOME = Session("wayland", "gnome", wayland_display="wayland-0")


class Desktop:
    """An X11 desktop whose focused window the test moves (xdotool getwindowfocus + xprop replayed)."""

    def __init__(self, window: str | None = "4242"):
        self.window = window
        self.host = FakeHost({"xdotool", "xprop"}, responder=self.respond)

    def respond(self, argv, _input):
        if argv[:2] == ("xdotool", "getwindowfocus"):
            if self.window is None:
                return ProcResult(argv, 1, stderr=b"xdo_get_focused_window_sane failed (code=1)\n")
            return ProcResult(argv, 0, stdout=f"{self.window}\n".encode())
        if argv[0] == "xprop":
            return ProcResult(argv, 0, stdout=b'WM_CLASS(STRING) = "gedit", "Gedit"\n_NET_WM_PID(CARDINAL) = 1\n')
        return None


def chain_for(desktop: Desktop, *, typing: bool = True, session: Session = X11):
    options = OutputOptions(restore_delay_ms=60_000)
    keeper = ClipboardKeeper(FakeClipboard("user text"), options)
    keys = FakeKeys()
    if typing:
        backend = TypingBackend("fake-type", keys, options)
    else:
        backend = ClipboardPasteBackend("fake-paste", keeper, keys, session, desktop.host, options)
    guard = FocusGuard(session, desktop.host, own_window=lambda: None)
    return OutputChain("auto", [backend], ClipboardOnlyBackend(keeper), session, keeper, guard=guard), keys


# ---- the plan: text options on the text, keys and breaks around it -------------------------------------


def test_plan_applies_text_options_to_the_text_and_ends_in_a_space_only_after_text():
    options = TextOptions((Replacement("teh", "the"),), capitalize_first=True, trailing_space=True)
    actions = [Action("new_line"), Action("text", "teh end."), Action("enter")]
    assert plan_for(actions, options) == Plan(("\nThe end.", Keys("enter")))
    assert plan_for([Action("text", "teh end."), Action("new_paragraph")], options) == Plan(("The end.\n\n",))
    assert plan_for([Action("scratch"), Action("text", "hi")], options) == Plan((Undo(), "Hi "))
    assert plan_for([Action("text", "hi")], options) == Plan(("Hi ",))  # as without voice commands
    assert plan_for([], options) == Plan((), taken_back=True)  # "hello, scratch that": nothing left


def test_the_history_text_is_the_text_as_typed():
    plan = Plan((Undo(), "Dear Anna,\n", Keys("tab"), "thanks", Keys("enter")))
    assert plan.text == "Dear Anna,\n\tthanks\n" and plan.undoes and not plan.plain


# ---- keys and "scratch that" through the chain ----------------------------------------------------------


def test_a_plan_types_text_and_presses_keys_in_order():
    chain, keys = chain_for(Desktop())
    result = chain.perform(["Send it.", Keys("enter"), "Next"])
    assert result.ok, result.message
    assert keys.sent == ["type 'Send it.' None", "press enter 1", "type 'Next' None"]


def test_a_plan_of_text_alone_is_an_ordinary_delivery():
    chain, keys = chain_for(Desktop(), typing=False)
    result = chain.perform(["Hello\n", "there "])
    assert result.ok and keys.sent == ["ctrl+v"]  # one paste of the whole text, no key of its own
    assert chain.keeper.clipboard.text() == "Hello\nthere "


def test_scratch_that_removes_the_previous_dictation_character_by_character():
    chain, keys = chain_for(Desktop(), typing=False)
    assert chain.deliver("first ").ok
    assert chain.deliver("Grüße 你好 ").ok  # 9 characters, 17 bytes
    keys.sent.clear()

    result = chain.perform([Undo()])
    assert (result.ok, result.undone, result.undo_refused) == (True, 9, None)
    assert keys.sent == ["press backspace 9"]

    keys.sent.clear()
    result = chain.perform([Undo(), "second "])  # said again: the one before goes too, then new text
    assert (result.ok, result.undone) == (True, 6)
    assert keys.sent == ["press backspace 6", "ctrl+v"]


@pytest.mark.parametrize("moved_to", ["5151", None])
def test_scratch_that_is_refused_once_the_focus_moved(moved_to):
    desktop = Desktop()
    chain, keys = chain_for(desktop)
    assert chain.deliver("typed here").ok
    desktop.window = moved_to
    keys.sent.clear()

    result = chain.perform([Undo()])

    assert keys.sent == []
    if moved_to is None:  # no window at all: nothing is sent, as for text
        assert (result.ok, result.held_back) == (False, NO_WINDOW)
    else:
        assert (result.ok, result.undone, result.undo_refused) == (False, 0, MOVED)
        desktop.window = "4242"  # back in the window: it is still the newest dictation there
        assert chain.perform([Undo()]).undone == len("typed here")


def test_scratch_that_is_refused_after_an_enter_or_where_the_desktop_names_no_window():
    chain, keys = chain_for(Desktop())
    chain.deliver("hello")
    chain.perform([Keys("enter")])
    keys.sent.clear()
    assert chain.perform([Undo()]).undo_refused == AFTER_KEY and keys.sent == []

    gnome, keys = chain_for(Desktop(), session=GNOME)
    assert gnome.deliver("hello").ok
    result = gnome.perform([Undo()])
    assert (result.undo_refused, keys.sent[-1]) == (NO_WINDOW_ID, "type 'hello' None")


def test_scratch_that_with_nothing_typed_and_text_that_failed_half_way():
    chain, keys = chain_for(Desktop())
    assert chain.perform([Undo()]).undo_refused == NOTHING
    chain.deliver("one")
    keys.error = InjectionError("cut", input_sent=True)
    assert not chain.deliver("two").ok  # part of it may be in the window: Backspace cannot count it
    keys.error = None
    assert chain.perform([Undo()]).undo_refused == HALF_SENT


def test_keys_are_not_sent_into_no_window_and_the_text_waits_on_the_clipboard():
    desktop = Desktop(window=None)
    chain, keys = chain_for(desktop)
    result = chain.perform(["Send it.", Keys("enter")])
    assert (result.ok, result.held_back, result.on_clipboard) == (False, NO_WINDOW, True)
    assert keys.sent == [] and chain.keeper.clipboard.text() == "Send it."


# ---- each tool's way of pressing a key --------------------------------------------------------------------


def test_each_tool_presses_keys_without_the_text_on_any_command_line():
    host = FakeHost({"xdotool", "wtype", "ydotool"})
    XdotoolKeys(host, X11).press_key("backspace", 3)
    WtypeKeys(host, X11).press_key("enter", 2)
    YdotoolKeys(host, X11).press_key("tab", 1)
    xdotool, wtype, ydotool = host.argvs()
    assert xdotool[-5:] == ("--delay", "12", "--repeat", "3", "BackSpace") and "keyup" in xdotool
    assert wtype[3:] == ("-k", "Return", "-k", "Return")
    assert ydotool[-2:] == ("15:1", "15:0") and "29:0" in ydotool  # modifiers released first
